#!/usr/bin/env bash
# Builds the inferd plugins written in Python (every plugins/*/plugin.toml with
# `language = "python"`) into WebAssembly components with componentize-py: the bundled
# ones into target/lang-plugins/<name>.wasm, the test-only ones into
# target/lang-test-plugins/<name>.wasm, and both kinds into target/e2e-lang-plugins/ (the
# directory the test harnesses load them from). scripts/build-plugins.sh builds the Rust
# and C plugins; this script is separate because each Python component carries CPython
# (about 18 MB) and takes several seconds to build.
#
# Usage: scripts/build-plugins-python.sh     (from any directory)
# Env:   LANG_PLUGINS_OUT
#                       output directory of the bundled Python plugins (default:
#                       <repo>/target/lang-plugins)
#        LANG_TEST_PLUGINS_OUT
#                       output directory of the test-only ones, those whose plugin.toml has
#                       `test-only = true` (default: <repo>/target/lang-test-plugins)
#        E2E_LANG_PLUGINS_OUT
#                       output directory holding every Python plugin, bundled and test-only
#                       (default: <repo>/target/e2e-lang-plugins)
#        PYTHON         the Python that creates the tools' virtual environment (default:
#                       python3)
#
# A plugin is a folder plugins/<name>/ holding app.py (the module componentize-py wraps;
# its class implements the world's export) and plugin.toml:
#     language = "python"
#     world = "context-processor-plugin"   # or logits-processor-plugin, sampler-plugin
#     test-only = false
#
# 1. Installs what is missing: componentize-py (pinned below) in a virtual environment at
#    target/plugin-tools/python (python3-venv from apt, with sudo when not root, if the
#    venv module is missing); wasm-tools (cargo install) if not on PATH.
# 2. Runs `componentize-py -d wit -w <world> componentize -p <copy of plugins/<name>> app`
#    into target/plugins-build/python/<name>.wasm, skipped when that file is newer than every
#    input (the plugin folder's files, wit/*.wit, this script, the componentize-py
#    install).
# 3. Checks each component with `wasm-tools component wit`: it exports exactly the
#    interface of its world (besides componentize-py's internal `exports` instance) and
#    imports nothing but inferd:plugin/* and the WASI 0.2
#    interfaces the daemon's sandbox links; then copies it (only when changed) to its
#    output directory and to the e2e one, and prints one line per plugin.
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPT="$ROOT/scripts/$(basename -- "${BASH_SOURCE[0]}")"
OUT="${LANG_PLUGINS_OUT:-$ROOT/target/lang-plugins}"
TEST_OUT="${LANG_TEST_PLUGINS_OUT:-$ROOT/target/lang-test-plugins}"
E2E_OUT="${E2E_LANG_PLUGINS_OUT:-$ROOT/target/e2e-lang-plugins}"
BUILD="$ROOT/target/plugins-build/python"
VENV="$ROOT/target/plugin-tools/python"
WIT="$ROOT/wit"
PYTHON="${PYTHON:-python3}"
COMPONENTIZE_PY_VERSION=0.25.1
WASM_TOOLS_VERSION=1.263.0
SCRIPT_NAME=build-plugins-python
# WASI_ALLOWED, die, note, as_root.
# shellcheck source=scripts/plugin-build-lib.sh
source "$ROOT/scripts/plugin-build-lib.sh"
export PATH="$HOME/.cargo/bin:$PATH"

# Prints the string value of key $2 in TOML file $1 (`key = "value"` or `key = value` on
# one line; empty when absent).
toml_value() {
    sed -nE "s/^[[:space:]]*$2[[:space:]]*=[[:space:]]*\"?([^\"#]*[^\"#[:space:]])\"?[[:space:]]*(#.*)?\$/\\1/p" "$1" |
        head -n 1
}

# ---------------------------------------------------------------------------------------
# 1. Tools
# ---------------------------------------------------------------------------------------
CPY="$VENV/bin/componentize-py"
if ! "$CPY" --version 2>/dev/null | grep -qx "componentize-py $COMPONENTIZE_PY_VERSION"; then
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found (install Python 3)"
    if [[ ! -x $VENV/bin/pip ]]; then
        if ! "$PYTHON" -c "import venv, ensurepip" 2>/dev/null; then
            note "installing python3-venv (apt)"
            as_root apt-get update -qq
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
        fi
        rm -rf "$VENV"
        "$PYTHON" -m venv "$VENV"
    fi
    note "installing componentize-py $COMPONENTIZE_PY_VERSION into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION"
fi
if ! command -v wasm-tools >/dev/null; then
    command -v cargo >/dev/null || die "wasm-tools not found, nor cargo to install it"
    note "installing wasm-tools $WASM_TOOLS_VERSION"
    cargo install --locked "wasm-tools@$WASM_TOOLS_VERSION"
fi

# ---------------------------------------------------------------------------------------
# 2. Build
# ---------------------------------------------------------------------------------------
mkdir -p "$OUT" "$TEST_OUT" "$E2E_OUT" "$BUILD"
n_built=0
n_test=0
for toml in "$ROOT"/plugins/*/plugin.toml; do
    [[ -f $toml ]] || continue
    [[ $(toml_value "$toml" language) == python ]] || continue
    dir="$(dirname "$toml")"
    name="$(basename "$dir")"
    world="$(toml_value "$toml" world)"
    case "$world" in
    logits-processor-plugin) iface=logits-processor ;;
    context-processor-plugin) iface=context-processor ;;
    sampler-plugin) iface=sampler ;;
    *) die "$toml: world must be logits-processor-plugin, context-processor-plugin or sampler-plugin, got '$world'" ;;
    esac
    case "$(toml_value "$toml" test-only)" in
    true) dest="$TEST_OUT" test_only=1 ;;
    false | "") dest="$OUT" test_only=0 ;;
    *) die "$toml: test-only must be true or false" ;;
    esac
    [[ -f $dir/app.py ]] || die "$dir: no app.py"

    wasm="$BUILD/$name.wasm"
    fresh=1
    inputs=("$WIT"/*.wit "$SCRIPT" "$CPY")
    while IFS= read -r -d '' f; do inputs+=("$f"); done < <(
        find "$dir" -name __pycache__ -prune -o -type f -print0
    )
    for input in "${inputs[@]}"; do
        [[ -f $wasm && $wasm -nt $input ]] || fresh=0
    done
    if ((!fresh)); then
        started=$SECONDS
        # From a copy of the plugin folder: componentize-py's build-time CPython writes
        # __pycache__/ next to the sources it imports. -p: that copy only (VIRTUAL_ENV
        # unset so that the tools' own venv is not searched for packages).
        stage="$BUILD/src/$name"
        rm -rf "$stage"
        mkdir -p "$stage"
        cp -R "$dir"/. "$stage"
        find "$stage" -name __pycache__ -prune -exec rm -rf {} +
        log=$(cd "$BUILD" && env -u VIRTUAL_ENV "$CPY" -q -d "$WIT" -w "$world" \
            componentize -p "$stage" app -o "$wasm.tmp" 2>&1) ||
            die "componentize-py failed for $name:"$'\n'"$log"
        mv "$wasm.tmp" "$wasm"
        note "componentized $name ($world) in $((SECONDS - started)) s"
    fi

    # 3. Check: exports exactly the world's interface, imports only what the daemon links.
    wasm-tools validate "$wasm" || die "$wasm: not a valid WebAssembly component"
    wit_world=$(wasm-tools component wit "$wasm" | sed -n '/^world root {/,/^}/p')
    [[ -n $wit_world ]] || die "$wasm: not a component (no world found)"
    bad=$(grep -E '^\s*import ' <<<"$wit_world" |
        grep -Ev "^\s*import (inferd:plugin/(host|types)@|wasi:($WASI_ALLOWED)@0\.2\.)" || true)
    [[ -z $bad ]] || die "$wasm: imports what the daemon does not provide:"$'\n'"$bad"
    # componentize-py 0.25 leaves its own pre-initialisation entry point in the component
    # (`export exports: interface { ... init: func(...) ... }`); the daemon ignores it.
    exports=$(grep -E '^\s*export ' <<<"$wit_world" | grep -Evx '\s*export exports: interface \{' || true)
    [[ $(grep -c . <<<"$exports") -eq 1 ]] &&
        grep -Eqx "\s*export inferd:plugin/$iface@[0-9.]+;" <<<"$exports" ||
        die "$wasm: must export exactly inferd:plugin/$iface (world $world); found:"$'\n'"$exports"

    # Publish: copy only when changed.
    dst="$dest/$name.wasm"
    cmp -s "$wasm" "$dst" 2>/dev/null || cp "$wasm" "$dst"
    cmp -s "$wasm" "$E2E_OUT/$name.wasm" 2>/dev/null || cp "$wasm" "$E2E_OUT/$name.wasm"
    if ((test_only)) && [[ $(realpath -m "$OUT") != $(realpath -m "$TEST_OUT") ]]; then
        rm -f "$OUT/$name.wasm" # never left where the daemon loads bundled plugins
    fi
    printf 'built %-18s %s (%s bytes)\n' "$name" "$dst" "$(stat -c %s "$dst")"
    n_built=$((n_built + 1))
    n_test=$((n_test + test_only))
done
((n_built)) || die "no Python plugins (plugins/*/plugin.toml with language = \"python\") found"
note "Python plugins: $((n_built - n_test)) in $OUT, $n_test test-only in $TEST_OUT, all in $E2E_OUT; imports checked"
