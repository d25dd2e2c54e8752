#!/usr/bin/env bash
# Builds inferd with `--features cuda` on a machine without a GPU or a system CUDA
# install: nvcc, the CUDA headers and the CUDA libraries come from NVIDIA's PyPI wheels.
#
#   scripts/cuda-check.sh                        # `cargo build -p inferd --features cuda`
#   CUDA_CHECK_CMD=check scripts/cuda-check.sh   # `cargo check` (still runs nvcc: the
#                                                # kernels are built by a build script)
#
# Environment (all optional):
#   CUDA_VENV         venv holding the wheels  (default: target/cuda-venv-$CUDA_PIP_VERSION)
#   CUDA_PIP_VERSION  CUDA release of the wheels, 13.x (default: 13.0, which
#                     matches driver 580 / CUDA 13.0 on the H200 machines: PTX from a
#                     newer nvcc than the driver fails to load there)
#   CUDA_COMPUTE_CAP  GPU architecture for the kernels  (default: 90, H100/H200)
#   CARGO_TARGET_DIR  cargo's target dir                 (default: target/cuda)
#   CUDA_CHECK_CMD    build | check                      (default: build)
#   CUDA_ENV_ONLY=1   set up the venv and toolkit dir, print the env lines to export, stop
#
# The wheels are laid out into a toolkit-shaped folder $CUDA_VENV/cuda-root (bin/,
# include/, lib64/, nvvm/ as symlinks) because candle-kernels (cudaforge) and cudarc look
# for nvcc on PATH and for CUDA_HOME/{include,lib64}. The wheels have no libcuda.so
# (it comes with the driver), so a link-time stub with soname libcuda.so.1 is generated
# from cudarc's driver bindings into lib64/stubs; the real driver is used at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

cuda_ver=${CUDA_PIP_VERSION:-13.0}
venv=${CUDA_VENV:-$repo/target/cuda-venv-$cuda_ver}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target/cuda}
cmd=${CUDA_CHECK_CMD:-build}
major=${cuda_ver%%.*}

say() { echo "cuda-check: $*" >&2; }

# ---- 1. the wheels ------------------------------------------------------------------
# CUDA 13 only: the CUDA 12 wheel nvidia-cuda-nvcc-cu12 ships ptxas but no nvcc driver.
[[ "$major" == 13 ]] || { say "CUDA_PIP_VERSION must be 13.x (got $cuda_ver)"; exit 2; }
pkgs=("nvidia-cuda-nvcc==$cuda_ver.*" "nvidia-cuda-crt==$cuda_ver.*" "nvidia-nvvm==$cuda_ver.*"
    "nvidia-cuda-runtime==$cuda_ver.*" "nvidia-cuda-cccl==$cuda_ver.*"
    "nvidia-cuda-nvrtc==$cuda_ver.*" "nvidia-cublas==$cuda_ver.*" "nvidia-curand==10.4.*")
stamp="$venv/.inferd-cuda-wheels"
if [[ ! -x "$venv/bin/python" ]]; then
    say "creating venv $venv"
    python3 -m venv "$venv"
fi
if [[ "$(cat "$stamp" 2>/dev/null)" != "${pkgs[*]}" ]]; then
    say "installing ${pkgs[*]}"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${pkgs[@]}"
    echo "${pkgs[*]}" >"$stamp"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[[ -d "$site/nvidia" ]] || { say "no $site/nvidia after pip install"; exit 1; }

# ---- 2. a toolkit-shaped root -------------------------------------------------------
root=$venv/cuda-root
rm -rf "$root"
mkdir -p "$root/bin" "$root/include" "$root/lib64/stubs" "$root/nvvm"
ln -s lib64 "$root/lib"   # nvcc.profile puts $(TOP)/lib on LD_LIBRARY_PATH
link_tree() { # link_tree SRC DEST: DEST gets SRC's folders, with symlinks to its files
    if [[ -d "$1" ]]; then cp -rs --remove-destination "$1/." "$2/"; fi
}
for pkg in "$site"/nvidia/*/; do
    pkg=${pkg%/}
    link_tree "$pkg/bin" "$root/bin"
    link_tree "$pkg/include" "$root/include"
    link_tree "$pkg/nvvm" "$root/nvvm"
    link_tree "$pkg/lib" "$root/lib64"
    link_tree "$pkg/lib64" "$root/lib64"
done
# the linker wants libX.so; the wheels ship libX.so.N only
for f in "$root"/lib64/lib*.so.*; do
    base=${f%%.so.*}.so
    [[ -e "$base" ]] || ln -s "$(basename "$f")" "$base"
done
[[ -x "$root/bin/nvcc" ]] || { say "nvcc not found in the wheels"; exit 1; }

# ---- 3. libcuda.so link stub ----------------------------------------------------------
cudarc_ver=$(awk '/^name = "cudarc"$/ {getline; gsub(/[^0-9.]/, ""); print; exit}' Cargo.lock)
cargo fetch -q
cargo_home=${CARGO_HOME:-$HOME/.cargo}
bindings=$(ls "$cargo_home"/registry/src/*/"cudarc-$cudarc_ver"/src/driver/sys/mod.rs 2>/dev/null | head -1)
[[ -n "$bindings" ]] || { say "cudarc $cudarc_ver driver bindings not found under $cargo_home"; exit 1; }
grep -oE '^pub unsafe fn cu[A-Za-z0-9_]+' "$bindings" | awk '{print "int " $4 "(void) { return 999; }"}' \
    | sort -u >"$root/lib64/stubs/cuda_stub.c"
${CC:-cc} -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$root/lib64/stubs/libcuda.so" \
    "$root/lib64/stubs/cuda_stub.c"

# ---- 4. env -------------------------------------------------------------------------
export CUDA_HOME=$root CUDA_PATH=$root CUDA_ROOT=$root CUDA_TOOLKIT_ROOT_DIR=$root
export PATH=$root/bin:$PATH
export LD_LIBRARY_PATH=$root/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvcc_ver=$(nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
say "nvcc $nvcc_ver at $(command -v nvcc), CUDA_HOME=$root, CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP"
if [[ "${CUDA_ENV_ONLY:-0}" == 1 ]]; then
    printf 'export %s\n' "CUDA_HOME=$root" "CUDA_PATH=$root" "CUDA_ROOT=$root" \
        "CUDA_TOOLKIT_ROOT_DIR=$root" "CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP" \
        "PATH=$root/bin:\$PATH" "LD_LIBRARY_PATH=$root/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    exit 0
fi

# ---- 5. build -----------------------------------------------------------------------
case "$cmd" in
build | check) ;;
*) say "CUDA_CHECK_CMD must be build or check (got $cmd)"; exit 2 ;;
esac
start=$(date +%s)
cargo "$cmd" -p inferd --features cuda
secs=$(($(date +%s) - start))
echo "cuda-check: ok (cargo $cmd in ${secs}s, nvcc $nvcc_ver, compute cap $CUDA_COMPUTE_CAP)"
