#!/usr/bin/env bash
# Random LoRA adapters for the LoRA section of inferd-bench (`--lora-make N`), for any GGUF base.
#
#   scripts/lora-bench-adapters.sh BASE.gguf N [FIRST_SEED]
#
# Makes (when missing) N adapters with scripts/make-lora-gguf.py, rank 8, alpha 16, F16, on all
# seven projections, seeds FIRST_SEED..FIRST_SEED+N-1 (default 1..N):
#     $INFERD_LORA_DIR/<base file stem>-r8-s<seed>.gguf
# and prints their paths, one a line, on stdout (progress on stderr). An existing file is kept
# (make-lora-gguf.py is deterministic: the same seed, base and pinned numpy/gguf give the same
# bytes). Needs numpy + gguf: the venv $INFERD_LORA_VENV is made when missing, with the pins of
# scripts/lora-gguf.sh (~10 s); then about 2.5 s per adapter on the 1.5B Qwen2.5-Coder Q4_K_M.
#
# Environment:
#   INFERD_LORA_DIR    where the adapters go (default ~/.cache/inferd/lora).
#   INFERD_LORA_VENV   the numpy + gguf venv (default target/lora-venv).
#   INFERD_LORA_RANK   rank (default 8; alpha is twice the rank, so alpha/rank stays 2).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ldir="${INFERD_LORA_DIR:-$HOME/.cache/inferd/lora}"
venv="${INFERD_LORA_VENV:-$root/target/lora-venv}"
rank="${INFERD_LORA_RANK:-8}"
pins=(gguf==0.19.0 numpy==2.4.6 pyyaml==6.0.3)

first="${3:-1}"
if [ $# -lt 2 ] || [ $# -gt 3 ] || ! [[ "$2" =~ ^[1-9][0-9]*$ ]] || ! [[ "$first" =~ ^[0-9]+$ ]] \
    || ! [[ "$rank" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/lora-bench-adapters.sh BASE.gguf N [FIRST_SEED]" \
        "(N >= 1; INFERD_LORA_RANK a positive integer)" >&2
    exit 2
fi
base="$1"
n="$2"
[ -f "$base" ] || { echo "lora-bench-adapters: no base model $base" >&2; exit 1; }
stem="$(basename "$base")"
stem="${stem%.gguf}"
mkdir -p "$ldir"

made_venv=""
need_venv() {
    [ -z "$made_venv" ] || return 0
    if ! "$venv/bin/python" -c "import gguf, numpy, yaml" 2>/dev/null; then
        echo "lora-bench-adapters: making $venv (${pins[*]})" >&2
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "${pins[@]}"
    fi
    made_venv=1
}

for seed in $(seq "$first" $((first + n - 1))); do
    out="$ldir/$stem-r$rank-s$seed.gguf"
    if [ ! -s "$out" ]; then
        need_venv
        echo "lora-bench-adapters: writing $out (rank $rank, alpha $((2 * rank)), f16, seed $seed)" >&2
        "$venv/bin/python" "$root/scripts/make-lora-gguf.py" --base "$base" --out "$out" \
            --rank "$rank" --alpha "$((2 * rank))" --type f16 --seed "$seed" --quiet >&2
    fi
    echo "$out"
done
