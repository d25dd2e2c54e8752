#!/usr/bin/env bash
# Disk-tier footprint under constant eviction: starts the release daemon with a small
# prefix_store.max_bytes, sends N distinct ~550-token prompts (1 token each), and every
# 10 prompts prints the daemon's resident memory and the store's sizes (block files,
# whole directory, sled index). Usage: scripts/prefix-store-footprint.sh [N] [MAX_BYTES]
# (defaults 80 and 2097152). Needs `cargo build --release -p inferd -p inferd-cli`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
n_prompts="${1:-80}"
max_bytes="${2:-2097152}"
model="${INFERD_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[[ -f "$model" ]] || model="$root/../shared/models/SmolLM2-135M-Instruct.Q4_1.gguf"
work="$(mktemp -d)"
port="${PORT:-18181}"
INFERD__PREFIX_STORE__PATH="$work/store" INFERD__PREFIX_STORE__MAX_BYTES="$max_bytes" \
    target/release/inferd serve --model "$model" --listen "127.0.0.1:$port" \
    >"$work/daemon.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 120); do
    grep -q "listening" "$work/daemon.log" && break
    sleep 1
done
files_bytes() { find "$work/store/blocks" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
words=(alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike
    november oscar papa quebec romeo sierra tango)
printf '%8s %10s %12s %12s %12s\n' prompts rss_kb block_files store_bytes index_bytes
for n in $(seq 1 "$n_prompts"); do
    p="Document $n:"
    for k in $(seq 1 300); do p="$p ${words[$(((n * 7 + k * k * 13 + k) % 20))]}"; done
    target/release/inferd-cli --url "ws://127.0.0.1:$port/v1/ws" complete "$p" \
        --max-tokens 1 --temperature 0 >/dev/null 2>&1
    if ((n % 10 == 0)); then
        printf '%8d %10d %12d %12d %12d\n' "$n" "$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")" \
            "$(files_bytes)" "$(du -sb "$work/store" | cut -f1)" \
            "$(du -sb "$work/store/index" | cut -f1)"
    fi
done
kill -TERM "$pid"
wait "$pid"
echo "daemon exit $? (max_bytes $max_bytes)"
