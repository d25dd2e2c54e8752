#!/usr/bin/env bash
# The LoRA goals in one inferd-bench run (serve scenario plus its LoRA section), speculation off:
#   1. one rank-8 adapter (all seven projections), single stream: decode >= 0.85x and prefill >= 0.8x
#      the base model on the same daemon;
#   2. 16 streams round-robin over 4 adapters >= 0.8x 16 streams all on one adapter (aggregate tok/s);
#   3. inferd with the adapter against llama-server --lora with the same GGUF file: decode >= 1.2x,
#      prefill >= 1.0x.
# The four adapters are made when missing by scripts/lora-bench-adapters.sh (rank 8, alpha 16, F16,
# seeds 1-4, ~/.cache/inferd/lora/<model stem>-r8-s<seed>.gguf, ~2.5 s each on the 1.5B).
#
#   [SPEC=off|ngram|draft] scripts/bench-lora.sh [MODEL.gguf] [EXTRA INFERD-BENCH ARGS...]
#
# MODEL defaults to ~/.cache/inferd/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf. SPEC (default
# off) is the daemons' speculative decoding (INFERD__SPECULATIVE__METHOD; llama-server runs without).
# The JSON goes to target/bench/lora-<model stem>.json, lora-<model stem>-<SPEC>.json when SPEC is
# not off. Builds inferd and inferd-bench first (release). About 7 minutes on the 1.5B with 2
# threads (one run: 7 min 7 s): the main section, then a second daemon with the adapters, then
# llama-server -np 1 --lora.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
model="${1:-$HOME/.cache/inferd/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
shift || true
stem="$(basename "$model" .gguf)"
spec="${SPEC:-off}"
out="target/bench/lora-$stem.json"
[ "$spec" = off ] || out="target/bench/lora-$stem-$spec.json"
cargo build --release -p inferd -p inferd-bench
exec target/release/inferd-bench --model "$model" --concurrency 1,16 --max-tokens 64 \
    --prefill-reps 4 --decode-reps 4 --llama-bench-reps 2 --bw-runs 3 \
    --env "INFERD__SPECULATIVE__METHOD=$spec" --lora-make 4 \
    --out "$out" "$@"
