#!/usr/bin/env bash
# Image-input latency benchmark: inferd against llama.cpp's llama-server (--mmproj) on the
# GGUF fixtures of daemon/tests/fixtures/vlm-gguf (see scripts/bench-vision.py). Builds
# nothing: needs target/release/inferd (cargo build --release -p inferd) and a native
# llama-server. Writes target/bench/vision.json and prints a table.
#
#   scripts/bench-vision.sh [--n 15] [--warmup 2] [--families gemma3,qwen2_5_vl,llava,smolvlm] ...
#
# PY: a python with numpy and Pillow (default /tmp/vlm-venv/bin/python, the venv of
# daemon/tests/fixtures/vlm/README.md). LLAMA_SERVER: the llama-server binary (default the
# llama-cpp-python 0.3.36 vendored build under ~/.cache/inferd).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py=${PY:-/tmp/vlm-venv/bin/python}
llama=${LLAMA_SERVER:-$HOME/.cache/inferd/llamacpp-0.3.36/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server}
if [[ ! -x target/release/inferd ]]; then
    echo "bench-vision: target/release/inferd missing: cargo build --release -p inferd" >&2
    exit 1
fi
if [[ ! -x $llama ]]; then
    echo "bench-vision: no llama-server at $llama (set LLAMA_SERVER)" >&2
    exit 1
fi
if ! "$py" -c 'import numpy, PIL' 2>/dev/null; then
    echo "bench-vision: $py lacks numpy/Pillow (set PY)" >&2
    exit 1
fi
exec "$py" scripts/bench-vision.py --llama-server "$llama" "$@"
