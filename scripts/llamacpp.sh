#!/usr/bin/env bash
# The peer and numerical reference: llama.cpp built natively, outside the repository.
#
#   scripts/llamacpp.sh build     downloads the PyPI sdist of llama-cpp-python 0.3.36 (which
#                                 vendors llama.cpp b11312), builds vendor/llama.cpp with cmake
#                                 (Release, GGML_NATIVE=ON, OpenMP) and prints the bin folder.
#   scripts/llamacpp.sh bin       prints the bin folder (building first when it is missing).
#   scripts/llamacpp.sh bin|build TARGET...
#                                 the same for just the named targets (e.g. `bin llama-quantize`,
#                                 what CI needs: it compiles ggml, llama and the tool only, a few
#                                 minutes instead of the full set). `bin` counts the build as
#                                 present when those targets are; a later plain `bin` builds the rest.
#
# Everything lives under $INFERD_LLAMACPP_DIR (default ~/.cache/inferd/llamacpp-0.3.36):
# the sdist, its source tree, build/ and build/bin/{llama-server,llama-bench,llama-quantize,
# llama-tokenize}. `build-info.txt` there records the commit and the flags. cmake is
# installed from PyPI when the machine has none. A 2-core machine needs about 15 minutes.
set -euo pipefail

version="0.3.36"
dir="${INFERD_LLAMACPP_DIR:-$HOME/.cache/inferd/llamacpp-$version}"
src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
bin="$src/build/bin"
all_targets=(llama-server llama-bench llama-quantize llama-tokenize)
targets=("${all_targets[@]}")
flags=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DLLAMA_CURL=OFF
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON
       -DLLAMA_BUILD_SERVER=ON)
# A CPU that reports AMX (Sapphire Rapids and later) makes -march=native compile ggml's AMX
# matrix kernels, and ggml uses them whenever the kernel grants the tile state; in our VMs
# the first tile instruction then dies with SIGILL (llama-bench and llama-server crash on
# the first product). So the build keeps everything -march=native gives but AMX.
# (The macros are captured first: with pipefail, `cc ... | grep -q` fails whenever grep exits on
# its match before cc has written the rest and cc dies of SIGPIPE - more than half the time.)
native_macros="$(echo | cc -march=native -dM -E - 2>/dev/null || true)"
if [[ $native_macros == *__AMX_TILE__* ]]; then
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    flags+=("-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx")
fi

built() {
    for t in "${targets[@]}"; do [ -x "$bin/$t" ] || return 1; done
    # a build made with other flags (before the AMX rule above, say) is made again
    grep -qxF "cmake ${flags[*]}" "$dir/build-info.txt" 2>/dev/null
}

build() {
    mkdir -p "$dir"
    if [ ! -f "$src/CMakeLists.txt" ]; then
        echo "llamacpp: downloading the llama-cpp-python $version sdist" >&2
        python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
            -d "$dir" "llama-cpp-python==$version"
        tar -xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir"
    fi
    if ! command -v cmake >/dev/null; then
        python3 -m pip install --quiet --disable-pip-version-check cmake
    fi
    echo "llamacpp: building ${targets[*]} in $src/build" >&2
    cmake -S "$src" -B "$src/build" "${flags[@]}" >"$dir/cmake-configure.log" 2>&1
    cmake --build "$src/build" --config Release -j "$(nproc)" --target "${targets[@]}" \
        >"$dir/cmake-build.log" 2>&1
    # without llama-server (a partial build): the same facts from the generated build-info.cpp
    local bi="$src/build/common/build-info.cpp" commit
    commit="$(sed -n 's/.*LLAMA_BUILD_NUMBER = \([0-9]*\);.*/build \1/p; s/.*LLAMA_COMMIT = "\(.*\)";.*/commit \1/p;
                      s/.*LLAMA_COMPILER = "\(.*\)";.*/built with \1/p; s/.*LLAMA_BUILD_TARGET = "\(.*\)";.*/for \1/p' \
              "$bi" 2>/dev/null | paste -sd' ' || true)"
    {
        echo "llama-cpp-python $version sdist, vendor/llama.cpp"
        if [ -x "$bin/llama-server" ]; then
            "$bin/llama-server" --version 2>&1 | grep -E 'version|built' || echo "$commit"
        else
            echo "$commit"
        fi
        echo "cmake ${flags[*]}"
        if [ "${targets[*]}" != "${all_targets[*]}" ]; then echo "targets ${targets[*]}"; fi
    } >"$dir/build-info.txt"
}

cmd="${1:-}"
if [ $# -gt 1 ]; then
    shift
    targets=("$@")
fi
case "$cmd" in
    build) build; echo "$bin" ;;
    bin) built || build; echo "$bin" ;;
    *) echo "usage: scripts/llamacpp.sh build|bin [TARGET...]" >&2; exit 2 ;;
esac
