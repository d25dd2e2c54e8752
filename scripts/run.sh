#!/usr/bin/env bash
# Fetches the default model, builds the bundled Wasm plugins into target/plugins, and
# starts the daemon on it (release build), with the default config. Extra arguments go
# to `inferd serve` (e.g. --listen 127.0.0.1:9000; a non-loopback address also needs
# server.api_key, see docs/http-api.md); `--model PATH` skips the default model's fetch,
# and `--config FILE` replaces configs/inferd.toml.
#
# The release build takes nearly all of a first run, so the model download and the
# plugin build run beside it: the download waits on the network, and the plugin build
# runs at the lowest CPU priority, so it takes up a core only when the daemon's build
# leaves one idle. Each step prints what it does and how long it took last time (kept in
# target/run-times). The README (Set-up) gives the measured time of a first run on a
# fresh 2-core machine (scripts/bench-first-run.sh); later runs start in seconds. The C
# plugin is built only when its tools are installed (scripts/build-plugins.sh --served;
# `--all` builds every plugin, as scripts/test.sh does).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-target}"
times="$target/run-times"
logs="$target/run-logs"
mkdir -p "$logs"
started=$SECONDS

# "3 min 12 s" for $1 seconds.
human() { if (($1 >= 60)); then echo "$(($1 / 60)) min $(($1 % 60)) s"; else echo "$1 s"; fi; }
# How long step $1 took last time, as " (last time here: 3 min 12 s)", or nothing.
last() {
    local s
    s=$(awk -v n="$1" '$1 == n { s = $2 } END { if (s != "") print s }' "$times" 2>/dev/null || true)
    [[ -z $s ]] || echo " (last time here: $(human "$s"))"
}
# Records that step $1 took $2 seconds.
record() {
    { grep -v "^$1 " "$times" 2>/dev/null || true; echo "$1 $2"; } >"$times.tmp"
    mv "$times.tmp" "$times"
}
# Runs step $1 in the background with its output in $logs/$1.log; the command follows.
# The step writes its own duration to $logs/$1.seconds when it succeeds (what `finish`
# records: the step's time, not how long the build kept it waiting).
declare -A pids=()
background() {
    local name=$1
    shift
    rm -f "$logs/$name.seconds"
    (
        t=$SECONDS
        "$@" >"$logs/$name.log" 2>&1 &
        step=$!
        # The EXIT trap below signals this subshell: pass it on to the step.
        trap 'kill "$step" 2>/dev/null; exit 143' TERM
        wait "$step"
        echo $((SECONDS - t)) >"$logs/$name.seconds"
    ) &
    pids[$name]=$!
}
# Waits for background step $1; on failure prints its log and exits, or with $2 = "warn"
# prints its log and goes on.
finish() {
    local name=$1
    if ! wait "${pids[$name]}"; then
        echo "run.sh: step '$name' failed; its output ($logs/$name.log):" >&2
        cat "$logs/$name.log" >&2
        [[ ${2:-} == warn ]] || exit 1
        return 0
    fi
    record "$name" "$(cat "$logs/$name.seconds")"
    grep -h '^build-plugins: skipping' "$logs/$name.log" >&2 || true
}

# The user's --model replaces the default model (no fetch), and the user's --config
# replaces configs/inferd.toml (the default model is still fetched, as that config may
# name it, but a failed fetch is left for the daemon to report if it needs the file).
own_model="" own_config=""
for arg in "$@"; do
    case "$arg" in
    --model | --model=*) own_model=1 ;;
    --config | --config=*) own_config=1 ;;
    esac
done
config_args=(--config configs/inferd.toml)
[[ -z $own_config ]] || config_args=()

# A failed build leaves no background step running.
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
if [[ -z $own_model ]]; then
    echo "run.sh: fetching the default model in the background (scripts/fetch-model.sh)$(last model)" >&2
    background model scripts/fetch-model.sh
else
    echo "run.sh: --model given, so the default model is not fetched" >&2
fi
echo "run.sh: building the bundled plugins in the background, at low priority" \
    "(scripts/build-plugins.sh --served)$(last plugins)" >&2
background plugins nice -n 19 scripts/build-plugins.sh --served
echo "run.sh: building the daemon and the CLI (cargo build --release)$(last build)" >&2
t=$SECONDS
cargo build --release -p inferd -p inferd-cli
record build $((SECONDS - t))
if [[ -z $own_model ]]; then
    if [[ -z $own_config ]]; then finish model; else finish model warn; fi
fi
finish plugins
serve=(serve "${config_args[@]}" "$@")
echo "run.sh: starting the daemon, $(human $((SECONDS - started))) after run.sh started" \
    "(target/release/inferd ${serve[*]})" >&2
trap - EXIT
exec "$target/release/inferd" "${serve[@]}"
