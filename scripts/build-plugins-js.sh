#!/usr/bin/env bash
# Builds the inferd plugins written in JavaScript (every plugins/*/plugin.toml with
# `language = "javascript"`) into WebAssembly components with ComponentizeJS:
# target/plugins-build/js/<name>.wasm, copied to target/lang-plugins/ (bundled) or
# target/lang-test-plugins/ (`test-only = true`), and every one to target/e2e-lang-plugins/.
#
# Usage: scripts/build-plugins-js.sh         (from any directory)
# Env:   LANG_PLUGINS_OUT
#                       output directory of the bundled plugins (default:
#                       <repo>/target/lang-plugins)
#        LANG_TEST_PLUGINS_OUT
#                       output directory of the test-only plugins, those whose plugin.toml
#                       has `test-only = true` (default: <repo>/target/lang-test-plugins);
#                       the daemon does not load them by default
#        E2E_LANG_PLUGINS_OUT
#                       output directory holding every one of them (default:
#                       <repo>/target/e2e-lang-plugins), for the test harnesses
#
# A plugin is a folder plugins/<name>/ with app.js (an ES module exporting the world's
# interface, e.g. `export const contextProcessor = { info, configure, process }`) and
# plugin.toml:
#     language = "javascript"
#     world = "context-processor-plugin"   # or logits-processor-plugin, sampler-plugin
#     test-only = false
#
# 1. Installs what is missing: node and npm (apt packages nodejs, npm, with sudo when not
#    root); wasm-tools (cargo install); the npm packages pinned in
#    scripts/plugin-tools-js/package.json and package-lock.json (ComponentizeJS and its
#    jco) into target/plugin-tools/js, again whenever those two files change.
# 2. Builds each plugin with scripts/componentize-js.mjs (ComponentizeJS's JS API, not the
#    jco CLI) with the `http` and `fetch-event` features disabled: with them the component
#    imports wasi:http, which the daemon refuses. The other features stay (console,
#    Math.random/crypto, Date/performance), so the component imports WASI 0.2 io, clocks,
#    random, cli and filesystem, served by the daemon's sandbox that grants nothing.
#    Skipped when the output is newer than every input: the plugin folder's files,
#    wit/*.wit, this script, the .mjs and the installed tools.
# 3. Copies each component (only when it changed) to its output directory and to the e2e
#    one, prints `built <name> <path> (<bytes> bytes)`, and checks it: valid, exports
#    exactly its world's interface, imports nothing but inferd:plugin/* and the WASI 0.2
#    interfaces the daemon links.
# A build takes about 10-20 s per plugin (SpiderMonkey snapshot with wizer); a second run
# with nothing changed takes about a second.
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${LANG_PLUGINS_OUT:-$ROOT/target/lang-plugins}"
TEST_OUT="${LANG_TEST_PLUGINS_OUT:-$ROOT/target/lang-test-plugins}"
E2E_OUT="${E2E_LANG_PLUGINS_OUT:-$ROOT/target/e2e-lang-plugins}"
BUILD="$ROOT/target/plugins-build/js"
TOOLS="$ROOT/target/plugin-tools/js"
PINS="$ROOT/scripts/plugin-tools-js"
HELPER="$ROOT/scripts/componentize-js.mjs"
WIT="$ROOT/wit"
WASM_TOOLS_VERSION=1.263.0
SCRIPT_NAME=build-plugins-js
# WASI_ALLOWED, die, note, as_root.
# shellcheck source=scripts/plugin-build-lib.sh
source "$ROOT/scripts/plugin-build-lib.sh"
export PATH="$HOME/.cargo/bin:$PATH"

# Prints the string value of `key = "value"` in TOML file $1 (top-level keys only).
toml_string() {
    sed -n -E "s/^$2[[:space:]]*=[[:space:]]*\"([^\"]*)\"[[:space:]]*(#.*)?\$/\\1/p" "$1" | head -n 1
}

# ---------------------------------------------------------------------------------------
# 0. Which plugins
# ---------------------------------------------------------------------------------------
plugins=()
for manifest in "$ROOT"/plugins/*/plugin.toml; do
    [[ -f $manifest ]] || continue
    [[ $(toml_string "$manifest" language) == javascript ]] || continue
    plugins+=("$(basename "$(dirname "$manifest")")")
done
((${#plugins[@]})) || die "no plugins/*/plugin.toml with language = \"javascript\" under $ROOT/plugins"

# ---------------------------------------------------------------------------------------
# 1. Tools
# ---------------------------------------------------------------------------------------
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    note "installing nodejs and npm (apt)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
((node_major >= 18)) || die "node $(node --version) is too old: ComponentizeJS needs 18 or newer"
if ! command -v wasm-tools >/dev/null; then
    command -v cargo >/dev/null || die "wasm-tools not found, and no cargo to install it"
    note "installing wasm-tools $WASM_TOOLS_VERSION"
    cargo install --locked "wasm-tools@$WASM_TOOLS_VERSION"
fi

# The install is redone when the pinned package.json or package-lock.json changes (their
# hash is kept in $STAMP) or the packages are gone.
STAMP="$TOOLS/.inferd-pins"
pins_hash=$(cat "$PINS/package.json" "$PINS/package-lock.json" | sha256sum | cut -d' ' -f1)
if [[ ! -f $STAMP || $(<"$STAMP") != "$pins_hash" ||
    ! -f $TOOLS/node_modules/@bytecodealliance/componentize-js/package.json ]]; then
    note "installing the pinned npm packages into $TOOLS"
    mkdir -p "$TOOLS"
    rm -f "$STAMP"
    cp "$PINS/package.json" "$PINS/package-lock.json" "$TOOLS/"
    (cd "$TOOLS" && npm install --no-audit --no-fund --loglevel=error) ||
        die "npm install failed in $TOOLS"
    echo "$pins_hash" >"$STAMP"
fi

mkdir -p "$OUT" "$TEST_OUT" "$E2E_OUT" "$BUILD"

# ---------------------------------------------------------------------------------------
# 2. Build, 3. publish and check each plugin
# ---------------------------------------------------------------------------------------
n_bundled=0
n_test=0
for name in "${plugins[@]}"; do
    dir="$ROOT/plugins/$name"
    manifest="$dir/plugin.toml"
    world=$(toml_string "$manifest" world)
    case $world in
    logits-processor-plugin | context-processor-plugin | sampler-plugin) ;;
    *) die "$manifest: world must be logits-processor-plugin, context-processor-plugin or sampler-plugin (got \"$world\")" ;;
    esac
    [[ -f $dir/app.js ]] || die "$name: no app.js in $dir"
    test_only=$(sed -n -E 's/^test-only[[:space:]]*=[[:space:]]*([a-z]+)[[:space:]]*(#.*)?$/\1/p' "$manifest" | head -n 1)
    [[ $test_only == true || $test_only == false ]] ||
        die "$manifest: test-only must be true or false (got \"$test_only\")"
    if [[ $test_only == true ]]; then
        dest=$TEST_OUT
        n_test=$((n_test + 1))
    else
        dest=$OUT
        n_bundled=$((n_bundled + 1))
    fi

    out="$BUILD/$name.wasm"
    fresh=1
    mapfile -t inputs < <(find "$dir" -type f)
    for input in "${inputs[@]}" "$WIT"/*.wit "${BASH_SOURCE[0]}" "$HELPER" "$STAMP"; do
        [[ -f $out && $out -nt $input ]] || fresh=0
    done
    if ((!fresh)); then
        note "building $name ($world)"
        node "$HELPER" "$TOOLS" "$dir/app.js" "$WIT" "$world" "$out" ||
            die "$name: ComponentizeJS failed"
    fi

    # Check: a valid component exporting exactly its world's interface and importing only
    # what the daemon links.
    wasm-tools validate "$out" || die "$out: not a valid WebAssembly component"
    root=$(wasm-tools component wit "$out" | sed -n '/^world root {/,/^}/p')
    [[ -n $root ]] || die "$out: not a component (no world found)"
    allowed="inferd:plugin/(host|types)@|wasi:($WASI_ALLOWED)@0\.2\.[0-9]+;"
    bad=$(grep -E '^\s*import ' <<<"$root" | grep -Ev "^\s*import ($allowed)" || true)
    [[ -z $bad ]] || die "$out: imports what the daemon does not provide:"$'\n'"$bad"
    exports=$(grep -E '^\s*export ' <<<"$root" || true)
    [[ $(grep -c . <<<"$exports") -eq 1 ]] &&
        grep -Eqx "\s*export inferd:plugin/${world%-plugin}@[0-9.]+;" <<<"$exports" ||
        die "$out: must export exactly inferd:plugin/${world%-plugin}; found:"$'\n'"$exports"

    dst="$dest/$name.wasm"
    cmp -s "$out" "$dst" 2>/dev/null || cp "$out" "$dst"
    cmp -s "$out" "$E2E_OUT/$name.wasm" 2>/dev/null || cp "$out" "$E2E_OUT/$name.wasm"
    # A test-only plugin is never left where the daemon loads by default (e.g. by an older
    # build), unless both directories are the same.
    if [[ $dest == "$TEST_OUT" && $(realpath -m "$OUT") != $(realpath -m "$TEST_OUT") ]]; then
        rm -f "$OUT/$name.wasm"
    fi
    printf 'built %-18s %s (%s bytes)\n' "$name" "$dst" "$(stat -c %s "$dst")"
done
note "JavaScript plugins: $n_bundled in $OUT, $n_test test-only in $TEST_OUT, all in $E2E_OUT; imports checked"
