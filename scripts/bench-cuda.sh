#!/usr/bin/env bash
# Serving benchmark of inferd on an NVIDIA GPU (model.device = "cuda:0"), without the
# llama.cpp peer. For a machine with a GPU and its driver; CUDA comes from the system
# (nvcc on PATH or CUDA_HOME) or, failing that, from PyPI wheels via scripts/cuda-check.sh.
#
#   scripts/bench-cuda.sh [extra inferd-bench args]
#   BENCH_NO_BUILD=1 scripts/bench-cuda.sh   # use target/release/{inferd,inferd-bench}
#                                            # as they are (built elsewhere, carried here)
# Env: CUDA_COMPUTE_CAP (default 90), OUT (where serve_bench.json goes; default target/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
out=${OUT:-target/bench}

if [[ "${BENCH_NO_BUILD:-0}" != 1 ]]; then
    if ! command -v nvcc >/dev/null && [[ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]]; then
        env_lines=$(CUDA_ENV_ONLY=1 scripts/cuda-check.sh)   # nvcc etc. from PyPI wheels
        eval "$env_lines"
    fi
    [[ -n "${CUDA_HOME:-}" || ! -d /usr/local/cuda ]] || export CUDA_HOME=/usr/local/cuda
    [[ -z "${CUDA_HOME:-}" ]] || export PATH=$CUDA_HOME/bin:$PATH
    cargo build --release -p inferd -p inferd-bench --features inferd/cuda
fi
scripts/fetch-model.sh

# The CUDA libraries the binary links (cublas, curand, nvrtc, cudart): system toolkit,
# then any pip wheels of python3 (nvidia/*/lib); libcuda.so.1 comes with the driver.
libs=()
for d in "${CUDA_HOME:-}/lib64" /usr/local/cuda/lib64 \
    "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)"/nvidia/*/lib; do
    [[ -d "$d" ]] && libs+=("$d")
done
export LD_LIBRARY_PATH=$(IFS=:; echo "${libs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ldd target/release/inferd | grep 'not found'; then
    echo "bench-cuda: target/release/inferd is missing the libraries above" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

target/release/inferd-bench --bin target/release/inferd \
    --env INFERD__MODEL__DEVICE=cuda:0 --no-peer --concurrency 1,4,16,64 "$@"
mkdir -p "$out"
if [[ "$(realpath "$out")" != "$(realpath target/bench)" ]]; then
    cp target/bench/serve_bench.json "$out/"
    cp target/bench/*.inferd.log "$out/" 2>/dev/null || true
fi
echo "bench-cuda: wrote $out/serve_bench.json"
