#!/usr/bin/env bash
# Quantization parity files and their llama.cpp references.
#
#   scripts/quant-parity.sh files [--update-manifest]
#       Makes the test files from the default model (models/SmolLM2-135M-Instruct.Q4_1.gguf) with
#       `llama-quantize --allow-requantize SRC OUT TYPE 2`, for TYPE in Q8_0 Q4_0 Q5_1 Q4_K_M Q5_K_M
#       Q6_K F16, as $INFERD_QUANT_DIR/SmolLM2-135M-Instruct.<TYPE>.gguf. Idempotent: a file already
#       there with the manifest's SHA-256 and size is kept. Each file is written to <name>.part and
#       renamed only after its SHA-256 matched daemon/tests/fixtures/quant-parity/manifest.json; a
#       mismatch (llama-quantize built differently, or another llama.cpp) fails, naming the types,
#       and keeps the odd output as <name>.mismatch. --update-manifest instead (re)writes the manifest
#       from what was produced: file, sha256, size and the per-tensor type counts from the GGUF
#       header (e.g. how many tensors fell back to q5_0/q5_1/q8_0 because 576 is not a multiple of
#       256). Only llama-quantize is needed: it is built, alone, by `scripts/llamacpp.sh bin
#       llama-quantize` when missing (a few minutes; the full llama.cpp build is not required).
#   scripts/quant-parity.sh refs [LABEL...]
#       Runs `files` (checking), then regenerates llama.cpp's references, one small JSON per file in
#       daemon/tests/fixtures/quant-parity/<LABEL>.json: the seven types above, Q4_1 (the default
#       model itself), gemma3-Q4_K_M (models/gemma-3-270m-q4_k_m.gguf, as shipped) and
#       gemma3-Q4_K_M-swa-full (the same with llama-server --swa-full) and qwen-coder-1.5b-Q4_K_M
#       (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, scripts/fetch-model.sh qwen-coder-1.5b; its tokenizer is
#       its own, so its prompts are two raw texts and the own chats, all tokenized by the server).
#       Default: all.
#       For each file it starts `llama-server -m FILE --host 127.0.0.1 --port PORT -t 2 -np 1
#       -c 4096 --no-webui` (one at a time; killed by a trap afterwards), waits for /health, and
#       runs greedy POST /completion (prompt as token ids, n_predict 32, temperature 0, top_k 1,
#       seed 0, cache_prompt false, return_tokens true, n_probs 2, post_sampling_probs false) on a
#       fixed prompt set: the fixture prompts of ../shared/fixtures/llamacpp/reference.json (chat a,
#       chat b, raw completion; for Gemma the raw prompts of llamacpp-gemma3/reference.json) plus
#       four own chats rendered by POST /apply-template and tokenized by POST /tokenize. Per prompt:
#       prompt_token_ids, generated_token_ids, and per generated position [top1_id, top1_p,
#       top2_id, top2_p] of the softmax of the raw logits (see meta.probabilities in the JSON).
#       Needs the full llama.cpp build (scripts/llamacpp.sh bin); a minute or so per file.
#
# Environment:
#   INFERD_QUANT_DIR      where the quantized files go (default ~/.cache/inferd/quant-files).
#   INFERD_LLAMACPP_DIR   llama.cpp build folder, as in scripts/llamacpp.sh
#                         (default ~/.cache/inferd/llamacpp-0.3.36).
#   INFERD_QUANT_PORT     llama-server port for `refs` (default: a free port picked at start).
#   INFERD_QUANT_SRC      the source model (default models/SmolLM2-135M-Instruct.Q4_1.gguf,
#                         fetched by scripts/fetch-model.sh when missing).
#   INFERD_QUANT_REFS     where `refs` writes the JSON (default daemon/tests/fixtures/quant-parity;
#                         the parity tests read another folder from INFERD_PARITY_REFS).
#   INFERD_QUANT_SERVER_ARGS  extra llama-server arguments for `refs`, for experiments only (e.g.
#                         `--no-repack`; with GGML_CPU_TILED_MM=0 in the environment this gives
#                         llama.cpp's plain vec_dot path for every matrix).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
helper="$root/scripts/quant-parity.py"
fixtures="$root/daemon/tests/fixtures/quant-parity"
manifest="$fixtures/manifest.json"
refs="${INFERD_QUANT_REFS:-$fixtures}"
qdir="${INFERD_QUANT_DIR:-$HOME/.cache/inferd/quant-files}"
lldir="${INFERD_LLAMACPP_DIR:-$HOME/.cache/inferd/llamacpp-0.3.36}"
src="${INFERD_QUANT_SRC:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
gemma="$root/models/gemma-3-270m-q4_k_m.gguf"
qwen="${INFERD_MODEL_CACHE:-$HOME/.cache/inferd/models}/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
stem="SmolLM2-135M-Instruct"
types=(Q8_0 Q4_0 Q5_1 Q4_K_M Q5_K_M Q6_K F16)

usage() {
    echo "usage: scripts/quant-parity.sh files [--update-manifest] | refs [LABEL...]" >&2
    echo "  LABEL: ${types[*]} Q4_1 gemma3-Q4_K_M gemma3-Q4_K_M-swa-full qwen-coder-1.5b-Q4_K_M" >&2
    exit 2
}

need_src() {
    if [ ! -f "$src" ]; then
        [ -z "${INFERD_QUANT_SRC:-}" ] || { echo "quant-parity: $src missing" >&2; exit 1; }
        "$root/scripts/fetch-model.sh" >&2
    fi
}

do_files() {
    local update=()
    for arg in "$@"; do
        case "$arg" in
            --update-manifest) update=(--update-manifest) ;;
            *) usage ;;
        esac
    done
    need_src
    local bin
    bin="$("$root/scripts/llamacpp.sh" bin llama-quantize)"
    mkdir -p "$qdir" "$fixtures"
    python3 "$helper" files --bin "$bin" --src "$src" --dir "$qdir" --manifest "$manifest" \
        --build-info "$lldir/build-info.txt" "${update[@]}" "${types[@]}"
}

# shellcheck source=scripts/llama-server-lib.sh
source "$root/scripts/llama-server-lib.sh"

# ref_one LABEL FILE FAMILY SOURCE-DESCRIPTION [LLAMA-SERVER-ARG...]
ref_one() {
    local label="$1" file="$2" family="$3" source="$4" port
    shift 4
    local extra=("$@")
    # shellcheck disable=SC2206 # word splitting of the experiment arguments is wanted
    extra+=(${INFERD_QUANT_SERVER_ARGS:-})
    port="${INFERD_QUANT_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
    local cmd=("$bin/llama-server" -m "$file" --host 127.0.0.1 --port "$port" -t 2 -np 1 -c 4096 --no-webui "${extra[@]}")
    echo "quant-parity: $label: starting llama-server on port $port" >&2
    "${cmd[@]}" >"$server_log" 2>&1 &
    server_pid=$!
    if ! python3 "$helper" wait-health "http://127.0.0.1:$port" 180; then
        tail -n 30 "$server_log" >&2
        exit 1
    fi
    python3 "$helper" refs-one --url "http://127.0.0.1:$port" --model "$file" --label "$label" \
        --family "$family" --out "$refs/$label.json" --bin "$bin" \
        --build-info "$lldir/build-info.txt" --model-source "$source" \
        --server-cmd "llama-server -m $(basename "$file") --host 127.0.0.1 --port PORT -t 2 -np 1 -c 4096 --no-webui${extra[*]:+ ${extra[*]}}"
    stop_server
}

do_refs() {
    local labels=("$@")
    [ ${#labels[@]} -gt 0 ] || labels=("${types[@]}" Q4_1 gemma3-Q4_K_M gemma3-Q4_K_M-swa-full qwen-coder-1.5b-Q4_K_M)
    do_files
    bin="$("$root/scripts/llamacpp.sh" bin)"
    mkdir -p "$refs"
    server_log="$(mktemp)"
    trap cleanup EXIT
    trap 'cleanup; exit 130' INT TERM
    for label in "${labels[@]}"; do
        case "$label" in
            Q4_1)
                ref_one "$label" "$src" smollm2 "the default model as shipped (scripts/fetch-model.sh)" ;;
            gemma3-Q4_K_M)
                [ -f "$gemma" ] || "$root/scripts/fetch-model.sh" gemma3 >&2
                ref_one "$label" "$gemma" gemma3 "the second model as shipped (scripts/fetch-model.sh gemma3)" ;;
            gemma3-Q4_K_M-swa-full)
                # llama-server keeping the whole history of the sliding-window layers,
                # as inferd's KV pool does (llama.cpp's default SWA cache rounds otherwise).
                [ -f "$gemma" ] || "$root/scripts/fetch-model.sh" gemma3 >&2
                ref_one "$label" "$gemma" gemma3 "the second model as shipped (scripts/fetch-model.sh gemma3), llama-server --swa-full" --swa-full ;;
            qwen-coder-1.5b-Q4_K_M)
                [ -f "$qwen" ] || "$root/scripts/fetch-model.sh" qwen-coder-1.5b >&2
                ref_one "$label" "$qwen" own "the speed model as shipped (scripts/fetch-model.sh qwen-coder-1.5b)" ;;
            *)
                [[ " ${types[*]} " == *" $label "* ]] || usage
                ref_one "$label" "$qdir/$stem.$label.gguf" smollm2 \
                    "llama-quantize --allow-requantize $(basename "$src") $stem.$label.gguf $label 2 (see manifest.json)" ;;
        esac
    done
    # every SmolLM2 reference present must agree on the prompt ids (one tokenizer, many weights)
    local smol=()
    for label in "${types[@]}" Q4_1; do
        if [ -f "$refs/$label.json" ]; then smol+=("$refs/$label.json"); fi
    done
    if [ ${#smol[@]} -gt 1 ]; then python3 "$helper" check-prompts "${smol[@]}"; fi
}

case "${1:-}" in
    files) shift; do_files "$@" ;;
    refs) shift; do_refs "$@" ;;
    *) usage ;;
esac
