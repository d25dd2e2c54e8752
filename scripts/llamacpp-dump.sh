#!/usr/bin/env bash
# Dumps llama.cpp's intermediate tensors of a prefill and one decode step, for the
# op-by-op comparison in daemon/src/model/trace_tests.rs:
#
#   scripts/llamacpp-dump.sh MODEL.gguf OUT.bin TOKEN_ID...
#
# Builds scripts/llamacpp-dump.cpp against the native llama.cpp of scripts/llamacpp.sh
# (its build tree's headers and shared libraries) into that folder, then runs it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$("$root/scripts/llamacpp.sh" bin)"
src="$(cd "$bin/../.." && pwd)"
exe="$bin/llamacpp-dump"
if [ ! -x "$exe" ] || [ "$root/scripts/llamacpp-dump.cpp" -nt "$exe" ]; then
    g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" "$root/scripts/llamacpp-dump.cpp" \
        -L"$bin" -lllama -lggml -lggml-base -Wl,-rpath,"$bin" -o "$exe"
fi
exec "$exe" "$@"
