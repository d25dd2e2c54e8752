#!/usr/bin/env bash
# LoRA adapter test files and their llama.cpp references (modelled on scripts/quant-parity.sh, whose
# helper scripts/quant-parity.py provides the prompt set, the request and the JSON format).
#
#   scripts/lora-gguf.sh files [--update-manifest]
#       Makes four random LoRA adapters with scripts/make-lora-gguf.py into $INFERD_LORA_DIR:
#         smollm2-lora-f16.gguf     SmolLM2-135M-Instruct.Q4_1 base, rank 8, alpha 16, F16,  seed 1
#         smollm2-lora-q8_0.gguf    SmolLM2-135M-Instruct.Q4_1 base, rank 8, alpha 16, Q8_0, seed 2
#                                   (lora_a Q8_0; lora_b F16: ne[0] = 8 is not a multiple of 32)
#         smollm2-lora-f32-r4.gguf  SmolLM2-135M-Instruct.Q4_1 base, rank 4, alpha 8,  F32,  seed 3
#         gemma3-lora-f16.gguf      gemma-3-270m-q4_k_m base,         rank 8, alpha 16, F16,  seed 4
#       all seven projections (attn_q/k/v/output, ffn_gate/up/down) of every layer, --strength 0.08.
#       Idempotent: a file already there with the SHA-256 and size of
#       daemon/tests/fixtures/lora-gguf/manifest.json is kept; a new one is written as <file>.new
#       and renamed only when it matches (a mismatch is kept as <file>.mismatch and fails). The base
#       models must match the manifest's SHA-256 too (fetched by scripts/fetch-model.sh when
#       missing). --update-manifest (re)writes the manifest from what was produced instead.
#       Needs numpy + gguf: the venv $INFERD_LORA_VENV is made when missing (pip --no-deps
#       gguf==0.19.0 numpy==2.4.6 pyyaml==6.0.3, ~10 s). A few seconds once it exists.
#   scripts/lora-gguf.sh refs [LABEL...]
#       Runs `files` (checking), then writes llama.cpp's references, one JSON per label in
#       daemon/tests/fixtures/lora-gguf/<LABEL>.json, in the format of the quant-parity references
#       (same prompt set and request as quant-parity's Q4_1 / gemma3-Q4_K_M references of the same
#       base) plus meta.adapter (file, sha256, rank, alpha, type, seed, scale):
#         smollm2-f16-s1.0 smollm2-f16-s0.5 smollm2-q8_0-s1.0 smollm2-f32-r4-s1.0
#         gemma3-f16-s1.0 gemma3-f16-s0.5 gemma3-f16-s1.0-swa-full gemma3-f16-s0.5-swa-full
#       `llama-server -m BASE --host 127.0.0.1 --port PORT -t 2 -np 1 -c 4096 --no-webui --lora FILE`
#       (scale 1.0) or `... --lora-scaled FILE:0.5` (one at a time; killed by a trap afterwards).
#       gemma3-f16-s* run without --swa-full, like gemma3-Q4_K_M.json; the *-swa-full labels with
#       it, like gemma3-Q4_K_M-swa-full.json (it changes Gemma's probabilities, see README.md).
#       Default: all. Needs the full llama.cpp build (scripts/llamacpp.sh bin); seconds to a
#       minute per label.
#   scripts/lora-gguf.sh scale0
#       For smollm2-lora-f16 and gemma3-lora-f16: runs the prompt set on the base model alone (into a
#       temp file), then on the base with the adapter loaded and a per-request
#       "lora": [{"id": 0, "scale": 0}]: ids and probabilities must be identical. Also says how
#       this machine's base run compares with the committed quant-parity reference (Q4_1.json,
#       gemma3-Q4_K_M.json; made on another CPU, so it may differ). Prints, writes nothing.
#
# Environment:
#   INFERD_LORA_DIR       where the adapters go (default ~/.cache/inferd/lora).
#   INFERD_LORA_VENV      the numpy + gguf venv (default target/lora-venv).
#   INFERD_LORA_REFS      where `refs` writes the JSON (default daemon/tests/fixtures/lora-gguf).
#   INFERD_LLAMACPP_DIR   llama.cpp build folder, as in scripts/llamacpp.sh
#                         (default ~/.cache/inferd/llamacpp-0.3.36).
#   INFERD_QUANT_PORT     llama-server port (default: a free port picked at start).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
helper="$root/scripts/lora-gguf.py"
qphelper="$root/scripts/quant-parity.py"
fixtures="$root/daemon/tests/fixtures/lora-gguf"
manifest="$fixtures/manifest.json"
refs="${INFERD_LORA_REFS:-$fixtures}"
ldir="${INFERD_LORA_DIR:-$HOME/.cache/inferd/lora}"
venv="${INFERD_LORA_VENV:-$root/target/lora-venv}"
lldir="${INFERD_LLAMACPP_DIR:-$HOME/.cache/inferd/llamacpp-0.3.36}"
smollm2="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
gemma3="$root/models/gemma-3-270m-q4_k_m.gguf"
baserefs="$root/daemon/tests/fixtures/quant-parity"
pins=(gguf==0.19.0 numpy==2.4.6 pyyaml==6.0.3)
labels_all=(smollm2-f16-s1.0 smollm2-f16-s0.5 smollm2-q8_0-s1.0 smollm2-f32-r4-s1.0 gemma3-f16-s1.0 gemma3-f16-s0.5
            gemma3-f16-s1.0-swa-full gemma3-f16-s0.5-swa-full)

usage() {
    echo "usage: scripts/lora-gguf.sh files [--update-manifest] | refs [LABEL...] | scale0" >&2
    echo "  LABEL: ${labels_all[*]}" >&2
    exit 2
}

need_venv() {
    if ! "$venv/bin/python" -c "import gguf, numpy, yaml" 2>/dev/null; then
        echo "lora-gguf: making $venv (${pins[*]})" >&2
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "${pins[@]}"
    fi
}

need_bases() {
    [ -f "$smollm2" ] || "$root/scripts/fetch-model.sh" >&2
    [ -f "$gemma3" ] || "$root/scripts/fetch-model.sh" gemma3 >&2
}

do_files() {
    local update=()
    for arg in "$@"; do
        case "$arg" in
            --update-manifest) update=(--update-manifest) ;;
            *) usage ;;
        esac
    done
    need_venv
    need_bases
    mkdir -p "$ldir" "$fixtures"
    python3 "$helper" files --python "$venv/bin/python" --dir "$ldir" --manifest "$manifest" \
        --smollm2 "$smollm2" --gemma3 "$gemma3" "${update[@]}"
}

# shellcheck source=scripts/llama-server-lib.sh
source "$root/scripts/llama-server-lib.sh"

# start_server LABEL MODEL [LLAMA-SERVER-ARG...]: sets port; the server runs until stop_server
start_server() {
    local label="$1" model="$2"
    shift 2
    port="${INFERD_QUANT_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
    echo "lora-gguf: $label: starting llama-server on port $port" >&2
    "$bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -t 2 -np 1 -c 4096 --no-webui "$@" \
        >"$server_log" 2>&1 &
    server_pid=$!
    if ! python3 "$qphelper" wait-health "http://127.0.0.1:$port" 180; then
        tail -n 30 "$server_log" >&2
        exit 1
    fi
}

# ref_one LABEL ADAPTER-NAME SCALE [LLAMA-SERVER-ARG...]
ref_one() {
    local label="$1" name="$2" scale="$3" file base model family source lora_args
    shift 3
    local extra=("$@")
    IFS=$'\t' read -r file base < <(python3 "$helper" spec "$name")
    case "$base" in
        smollm2) model="$smollm2" family=smollm2 source="the default model as shipped (scripts/fetch-model.sh)" ;;
        gemma3) model="$gemma3" family=gemma3 source="the second model as shipped (scripts/fetch-model.sh gemma3)" ;;
    esac
    if [ "$scale" = "1.0" ]; then lora_args=(--lora "$ldir/$file"); else lora_args=(--lora-scaled "$ldir/$file:$scale"); fi
    lora_args+=("${extra[@]}")
    if [ ${#extra[@]} -gt 0 ]; then source="$source, llama-server ${extra[*]}"; fi
    start_server "$label" "$model" "${lora_args[@]}"
    local shown="${lora_args[*]}"
    python3 "$helper" refs-one --url "http://127.0.0.1:$port" --model "$model" --label "$label" \
        --family "$family" --out "$refs/$label.json" --bin "$bin" \
        --build-info "$lldir/build-info.txt" --model-source "$source" \
        --adapter "$ldir/$file" --scale "$scale" --manifest "$manifest" \
        --server-cmd "llama-server -m $(basename "$model") --host 127.0.0.1 --port PORT -t 2 -np 1 -c 4096 --no-webui ${shown//$ldir\//}"
    stop_server
    local baseref=Q4_1
    if [ "$base" = gemma3 ]; then baseref=gemma3-Q4_K_M; fi
    if [[ " ${extra[*]} " == *" --swa-full "* ]]; then baseref="$baseref-swa-full"; fi
    python3 "$helper" compare "$refs/$label.json" "$baserefs/$baseref.json" | tail -n 1 >&2
}

setup_server_env() {
    bin="$("$root/scripts/llamacpp.sh" bin)"
    server_log="$(mktemp)"
    trap cleanup EXIT
    trap 'cleanup; exit 130' INT TERM
}

do_refs() {
    local labels=("$@")
    [ ${#labels[@]} -gt 0 ] || labels=("${labels_all[@]}")
    for label in "${labels[@]}"; do [[ " ${labels_all[*]} " == *" $label "* ]] || usage; done
    do_files
    setup_server_env
    mkdir -p "$refs"
    for label in "${labels[@]}"; do
        # smollm2-f32-r4-s1.0 -> adapter smollm2-f32-r4, scale 1.0; -swa-full: llama-server --swa-full
        if [[ $label == *-swa-full ]]; then
            l="${label%-swa-full}"
            ref_one "$label" "${l%-s*}" "${l##*-s}" --swa-full
        else
            ref_one "$label" "${label%-s*}" "${label##*-s}"
        fi
    done
    local smol=()
    for label in "${labels_all[@]}"; do
        if [[ $label == smollm2-* && -f "$refs/$label.json" ]]; then smol+=("$refs/$label.json"); fi
    done
    if [ ${#smol[@]} -gt 0 ]; then python3 "$qphelper" check-prompts "$baserefs/Q4_1.json" "${smol[@]}"; fi
    local gem=()
    for label in "${labels_all[@]}"; do
        if [[ $label == gemma3-* && -f "$refs/$label.json" ]]; then gem+=("$refs/$label.json"); fi
    done
    if [ ${#gem[@]} -gt 0 ]; then python3 "$qphelper" check-prompts "$baserefs/gemma3-Q4_K_M.json" "${gem[@]}"; fi
}

# scale0_one NAME MODEL FAMILY BASE-REF: the base alone (reference made here, in a temp file), then
# the base with the adapter loaded and every request at "lora": [{"id": 0, "scale": 0}]
scale0_one() {
    local name="$1" model="$2" family="$3" baseref="$4" file base tmpref
    IFS=$'\t' read -r file base < <(python3 "$helper" spec "$name")
    tmpref="$(mktemp --suffix=.json)"
    start_server "$(basename "$model") without adapter" "$model"
    python3 "$qphelper" refs-one --url "http://127.0.0.1:$port" --model "$model" --label base-here \
        --family "$family" --out "$tmpref" --bin "$bin" --build-info "$lldir/build-info.txt" \
        --model-source "scale0 check" --server-cmd "-" 2>/dev/null
    stop_server
    echo "lora-gguf: this machine's base run vs the committed $(basename "$baseref"):" >&2
    python3 "$helper" same "$tmpref" "$baseref" || true
    start_server "$file at scale 0" "$model" --lora "$ldir/$file"
    local rc=0
    python3 "$helper" scale0 --url "http://127.0.0.1:$port" --family "$family" --base-ref "$tmpref" || rc=$?
    stop_server
    rm -f "$tmpref"
    return "$rc"
}

do_scale0() {
    do_files
    setup_server_env
    local rc=0
    scale0_one smollm2-f16 "$smollm2" smollm2 "$baserefs/Q4_1.json" || rc=1
    scale0_one gemma3-f16 "$gemma3" gemma3 "$baserefs/gemma3-Q4_K_M.json" || rc=1
    return "$rc"
}

case "${1:-}" in
    files) shift; do_files "$@" ;;
    refs) shift; do_refs "$@" ;;
    scale0) shift; [ $# -eq 0 ] || usage; do_scale0 ;;
    *) usage ;;
esac
