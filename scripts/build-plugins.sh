#!/usr/bin/env bash
# Builds the inferd WebAssembly plugins (plugins/) into target/plugins/<name>.wasm, the
# test-only ones into target/test-plugins/<name>.wasm, and both kinds into
# target/e2e-plugins/ (the directory the test harnesses' daemons load).
#
# The Python and JavaScript plugins (a plugin.toml with language = "python" or
# "javascript") are built by scripts/build-plugins-python.sh and build-plugins-js.sh into
# target/lang-plugins/ (test-only ones: target/lang-test-plugins/) and all of them into
# target/e2e-lang-plugins/: directories of their own, because each is an interpreter of
# 12-18 MB that takes 6-16 s to compile (and those that take the logits row need a longer
# call deadline than the default, docs/plugins.md), so no daemon loads them unless
# pointed at them.
#
# Usage: scripts/build-plugins.sh [--all | --no-python-js | --served]   (from any directory)
#        --all           (the default) every plugin, installing every tool that is missing:
#                        what scripts/test.sh runs, so no plugin is ever skipped there
#        --no-python-js  only the Rust and C plugins, installing the C plugin's tools; the
#                        Python and JavaScript ones need componentize-py (PyPI) and
#                        ComponentizeJS (npm), installed under target/plugin-tools/
#        --served        what scripts/run.sh serves, quickly on a fresh machine: the bundled
#                        Rust plugins (cargo alone), and the C plugin only when its tools
#                        (clang, wasm-ld, wasi-libc, wit-bindgen, wasm-tools) are already
#                        installed; otherwise it says so in one line and skips it, because
#                        `cargo install`ing wit-bindgen-cli and wasm-tools takes about 10
#                        minutes on 2 cores. The import checks of step 4 need wasm-tools:
#                        without it the daemon's own check at load time is the only one.
# Env:   PLUGINS_OUT    output directory (default: <repo>/target/plugins)
#        TEST_PLUGINS_OUT
#                       output directory of the test-only plugins, those whose Cargo.toml
#                       has `test-only = true` under [package.metadata.inferd] (default:
#                       <repo>/target/test-plugins); the daemon does not load them by
#                       default, a test copies them into its daemon's plugins.dir
#        E2E_PLUGINS_OUT
#                       output directory holding every plugin, bundled and test-only
#                       (default: <repo>/target/e2e-plugins): the tests' plugins.dir
#        LANG_PLUGINS_OUT, LANG_TEST_PLUGINS_OUT, E2E_LANG_PLUGINS_OUT
#                       the Python and JavaScript plugins' directories (see above)
#        WASI_SYSROOT   wasi-libc sysroot in Debian's layout (default: /usr, i.e.
#                       /usr/include/wasm32-wasi and /usr/lib/wasm32-wasi)
#
# 1. Installs what is missing: the wasm32-wasip2 Rust target; clang, lld and wasi-libc
#    (apt, with sudo when not root); wit-bindgen-cli and wasm-tools (cargo install).
# 2. Builds the Rust plugins: every cdylib crate of the cargo workspace plugins/Cargo.toml
#    (no_std, wit-bindgen), for wasm32-wasip2 (rustc emits components directly).
# 3. Builds the C plugin plugins/min_tokens_c: `wit-bindgen c` bindings, clang + wasm-ld
#    against wasi-libc (malloc and string functions only), `wasm-tools component new`.
# 4. Copies each component to its output directory and checks that it imports nothing
#    but inferd:plugin/* (no WASI), as the daemon requires; test fixtures marked
#    `wasi = true` under [package.metadata.inferd] may also import the WASI 0.2
#    interfaces the daemon's sandbox links.
# Quick when nothing changed: cargo is incremental and the C build is skipped when its
# output is newer than its inputs.
set -euo pipefail

with_lang=1
served=0 # 1: --served (bundled Rust plugins; C only when its tools are there)
case "${1:-}" in
"" | --all) ;;
--no-python-js) with_lang=0 ;;
--served)
    with_lang=0
    served=1
    ;;
*)
    echo "usage: $0 [--all | --no-python-js | --served]" >&2
    exit 2
    ;;
esac

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${PLUGINS_OUT:-$ROOT/target/plugins}"
TEST_OUT="${TEST_PLUGINS_OUT:-$ROOT/target/test-plugins}"
E2E_OUT="${E2E_PLUGINS_OUT:-$ROOT/target/e2e-plugins}"
BUILD="$ROOT/target/plugins-build"
WIT="$ROOT/wit"
WASI_SYSROOT="${WASI_SYSROOT:-/usr}"
WIT_BINDGEN_VERSION=0.63.0
WASM_TOOLS_VERSION=1.263.0
TARGET=wasm32-wasip2
SCRIPT_NAME=build-plugins
# WASI_ALLOWED, die, note, as_root.
# shellcheck source=scripts/plugin-build-lib.sh
source "$ROOT/scripts/plugin-build-lib.sh"
export PATH="$HOME/.cargo/bin:$PATH"

# ---------------------------------------------------------------------------------------
# 1. Tools
# ---------------------------------------------------------------------------------------
command -v cargo >/dev/null || die "cargo not found (install Rust with rustup)"
if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
    note "adding the $TARGET Rust target"
    rustup target add "$TARGET"
fi

apt_missing=()
command -v clang >/dev/null || apt_missing+=(clang)
command -v wasm-ld >/dev/null || apt_missing+=(lld)
[[ -f $WASI_SYSROOT/lib/wasm32-wasi/libc.a ]] || apt_missing+=(wasi-libc)
with_c=1
if ((served)); then
    c_missing=("${apt_missing[@]}")
    command -v wit-bindgen >/dev/null || c_missing+=(wit-bindgen-cli)
    command -v wasm-tools >/dev/null || c_missing+=(wasm-tools)
    if ((${#c_missing[@]})); then
        with_c=0
        note "skipping the C plugin min_tokens: ${c_missing[*]} not installed" \
            "(scripts/build-plugins.sh --no-python-js installs them and builds it; about 10 min on 2 cores)"
    fi
    apt_missing=()
fi
if ((${#apt_missing[@]})); then
    note "installing ${apt_missing[*]} (apt)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}"
fi

if ((!with_c)); then
    :
elif ! command -v wit-bindgen >/dev/null; then
    note "installing wit-bindgen-cli $WIT_BINDGEN_VERSION"
    cargo install --locked "wit-bindgen-cli@$WIT_BINDGEN_VERSION"
elif ! wit-bindgen --version | grep -q " $WIT_BINDGEN_VERSION\$"; then
    note "warning: $(wit-bindgen --version) found, the C plugin is tested with $WIT_BINDGEN_VERSION"
fi
if ((with_c)) && ! command -v wasm-tools >/dev/null; then
    note "installing wasm-tools $WASM_TOOLS_VERSION"
    cargo install --locked "wasm-tools@$WASM_TOOLS_VERSION"
fi

mkdir -p "$OUT" "$TEST_OUT" "$E2E_OUT" "$BUILD"
built=() # output paths, checked at the end
n_test=0 # how many of them are test-only
declare -A wasi_ok=() # output paths allowed to import WASI (the daemon's allowed list)

# Copies component $1 to $3/$2.wasm ($3 defaults to $OUT) and to $E2E_OUT/$2.wasm (each
# only when it changed), and prints one line.
publish() {
    local src=$1 name=$2 dir=${3:-$OUT}
    local dst="$dir/$name.wasm"
    cmp -s "$src" "$dst" 2>/dev/null || cp "$src" "$dst"
    cmp -s "$src" "$E2E_OUT/$name.wasm" 2>/dev/null || cp "$src" "$E2E_OUT/$name.wasm"
    built+=("$dst")
    printf 'built %-18s %s (%s bytes)\n' "$name" "$dst" "$(stat -c %s "$dst")"
}

# ---------------------------------------------------------------------------------------
# 2. Rust plugins (the cdylib crates of plugins/Cargo.toml; crate name = plugin name).
#    A crate with `test-only = true` (under [package.metadata.inferd]) is a test fixture
#    that the daemon must not load by default: it goes to $TEST_OUT instead of $OUT.
#    Every plugin also goes to $E2E_OUT.
# ---------------------------------------------------------------------------------------
rust_plugins=()
test_plugins=()
for manifest in "$ROOT"/plugins/*/Cargo.toml; do
    if grep -q 'crate-type *= *\[ *"cdylib" *\]' "$manifest"; then
        name="$(basename "$(dirname "$manifest")")"
        if grep -Eq '^test-only *= *true' "$manifest"; then
            test_plugins+=("$name")
        else
            rust_plugins+=("$name")
        fi
    fi
done
((${#rust_plugins[@]})) || die "no Rust plugin crates found under $ROOT/plugins"
packages=()
if ((served)); then
    # Only the bundled ones (the test fixtures are the test command's).
    for name in "${rust_plugins[@]}"; do packages+=(-p "$name"); done
    test_plugins=()
fi
cargo build --release --target "$TARGET" \
    --manifest-path "$ROOT/plugins/Cargo.toml" --target-dir "$BUILD" "${packages[@]}"
for name in "${rust_plugins[@]}"; do
    publish "$BUILD/$TARGET/release/$name.wasm" "$name"
done
for name in "${test_plugins[@]}"; do
    publish "$BUILD/$TARGET/release/$name.wasm" "$name" "$TEST_OUT"
    if grep -Eq '^wasi *= *true' "$ROOT/plugins/$name/Cargo.toml"; then
        wasi_ok["$TEST_OUT/$name.wasm"]=1
    fi
    n_test=$((n_test + 1))
    # Never left where the daemon loads by default (e.g. by an older build), unless both
    # directories are the same.
    if [[ $(realpath -m "$OUT") != $(realpath -m "$TEST_OUT") ]]; then
        rm -f "$OUT/$name.wasm"
    fi
done

# ---------------------------------------------------------------------------------------
# 3. C plugin: min_tokens
# ---------------------------------------------------------------------------------------
C_SRC="$ROOT/plugins/min_tokens_c"
C_BUILD="$BUILD/min_tokens_c"
C_OUT="$C_BUILD/min_tokens.wasm"
c_inputs=("$WIT"/*.wit "$C_SRC"/*.c "$C_SRC"/*.h "${BASH_SOURCE[0]}")
c_fresh=1
for input in "${c_inputs[@]}"; do
    [[ -f $C_OUT && $C_OUT -nt $input ]] || c_fresh=0
done
if ((!with_c)); then
    :
elif ((!c_fresh)); then
    [[ -f $WASI_SYSROOT/include/wasm32-wasi/stdlib.h ]] ||
        die "wasi-libc headers not found under $WASI_SYSROOT/include/wasm32-wasi"
    rm -rf "$C_BUILD"
    mkdir -p "$C_BUILD/gen"
    # Bindings: logits_processor_plugin.{c,h} and the component-type object (it carries
    # the world, so the core module needs no separate `wasm-tools component embed`).
    gen_log=$(wit-bindgen c "$WIT" --world logits-processor-plugin --out-dir "$C_BUILD/gen" 2>&1) ||
        die "wit-bindgen c failed:"$'\n'"$gen_log"
    cflags=(--target=wasm32-wasi -O2 -std=c11 -Wall -Wextra -Werror
        -nostdinc -isystem "$(clang -print-resource-dir)/include"
        -isystem "$WASI_SYSROOT/include/wasm32-wasi" -I "$C_BUILD/gen" -I "$C_SRC")
    objects=()
    for src in "$C_SRC/config.c" "$C_SRC/min_tokens.c" "$C_BUILD/gen/logits_processor_plugin.c"; do
        obj="$C_BUILD/$(basename "$src" .c).o"
        clang "${cflags[@]}" -c "$src" -o "$obj"
        objects+=("$obj")
    done
    # A reactor (crt1-reactor.o: `_initialize`, which the component runs once) without
    # compiler-rt or the rest of the default libraries; libc.a only supplies malloc and
    # the string functions, none of which import WASI.
    clang --target=wasm32-wasi -nostdlib -Wl,--no-entry -Wl,--strip-debug \
        -o "$C_BUILD/core.wasm" "$WASI_SYSROOT/lib/wasm32-wasi/crt1-reactor.o" "${objects[@]}" \
        "$C_BUILD/gen/logits_processor_plugin_component_type.o" \
        "$WASI_SYSROOT/lib/wasm32-wasi/libc.a"
    if wasm-tools print "$C_BUILD/core.wasm" | grep -q '(import "wasi'; then
        die "min_tokens: the core module imports WASI (a libc function that needs it was linked)"
    fi
    wasm-tools component new "$C_BUILD/core.wasm" -o "$C_OUT.tmp"
    mv "$C_OUT.tmp" "$C_OUT"
fi
((with_c)) && publish "$C_OUT" min_tokens

# ---------------------------------------------------------------------------------------
# 3b. Python and JavaScript plugins (componentize-py, ComponentizeJS): WASI importers,
#     checked below against the daemon's allowed list like the `wasi = true` fixtures
# ---------------------------------------------------------------------------------------
lang_built=()
if ((with_lang)); then
    export LANG_PLUGINS_OUT="${LANG_PLUGINS_OUT:-$ROOT/target/lang-plugins}"
    export LANG_TEST_PLUGINS_OUT="${LANG_TEST_PLUGINS_OUT:-$ROOT/target/lang-test-plugins}"
    export E2E_LANG_PLUGINS_OUT="${E2E_LANG_PLUGINS_OUT:-$ROOT/target/e2e-lang-plugins}"
    "$ROOT/scripts/build-plugins-python.sh"
    "$ROOT/scripts/build-plugins-js.sh"
    for f in "$E2E_LANG_PLUGINS_OUT"/*.wasm; do
        [[ -f $f ]] || continue
        built+=("$f")
        lang_built+=("$f")
        wasi_ok["$f"]=1
        n_test=$((n_test + 1))
    done
fi

# ---------------------------------------------------------------------------------------
# 4. Check every component: valid, imports only inferd:plugin/* (and the allowed WASI
#    for those marked `wasi = true`), exports one plugin world
# ---------------------------------------------------------------------------------------
if ! command -v wasm-tools >/dev/null; then
    note "${#built[@]} plugins in $OUT; imports not checked here (no wasm-tools): the daemon checks them when it loads them"
    exit 0
fi
for f in "${built[@]}"; do
    wasm-tools validate "$f" || die "$f: not a valid WebAssembly component"
    world=$(wasm-tools component wit "$f" | sed -n '/^world root {/,/^}/p')
    [[ -n $world ]] || die "$f: not a component (no world found)"
    if [[ -n ${wasi_ok[$f]:-} ]]; then
        allowed="inferd:plugin/(host|types)@|wasi:($WASI_ALLOWED)@0\.2\."
    else
        allowed='inferd:plugin/(host|types)@'
    fi
    bad=$(grep -E '^\s*import ' <<<"$world" | grep -Ev "^\s*import ($allowed)" || true)
    [[ -z $bad ]] || die "$f: imports what the daemon does not provide to it:"$'\n'"$bad"
    # componentize-py also exports its own start-up hook, an unnamed-package interface
    # `exports` (its `init`, which the daemon never calls); only inferd:plugin/* counts.
    exports=$(grep -E '^\s*export ' <<<"$world" | grep -Evx '\s*export exports: interface \{' || true)
    [[ $(grep -c . <<<"$exports") -eq 1 ]] &&
        grep -Eqx '\s*export inferd:plugin/(logits-processor|context-processor|sampler)@[0-9.]+;' <<<"$exports" ||
        die "$f: must export exactly one of inferd:plugin/logits-processor, context-processor, sampler; found:"$'\n'"$exports"
done
lang_note="${#lang_built[@]} Python/JavaScript in ${E2E_LANG_PLUGINS_OUT:-}"
[[ -n ${E2E_LANG_PLUGINS_OUT:-} ]] || lang_note="Python/JavaScript skipped"
note "$((${#built[@]} - n_test)) plugins in $OUT, $((n_test - ${#lang_built[@]})) test-only in $TEST_OUT, all in $E2E_OUT; $lang_note; imports checked"
