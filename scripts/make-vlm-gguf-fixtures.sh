#!/usr/bin/env bash
# GGUF versions of the tiny random vision-language models of daemon/tests/fixtures/vlm and natively built
# llama.cpp's greedy answers about test images on them (see daemon/tests/fixtures/vlm-gguf/README.md).
#
#   scripts/make-vlm-gguf-fixtures.sh [--llama-cpp DIR] [--python PY] [--out DIR] [FAMILY...]
#
# For each FAMILY (default: gemma3 qwen2_5_vl llava smolvlm) writes into OUT/FAMILY/ (default
# daemon/tests/fixtures/vlm-gguf):
#   grad_WxH.png, noise_WxH.png  test images (made here, deterministic)
#   model.gguf                   text model, convert_hf_to_gguf.py --outtype f32 (SmolVLM: its Llama text model
#                                written out as a LlamaForCausalLM directory first)
#   mmproj.gguf                  vision tower + projector, convert_hf_to_gguf.py --mmproj --outtype f32 (LLaVA:
#                                tools/mtmd/legacy-models llava_surgery_v2.py + convert_image_encoder_to_gguf.py)
#   reference.json               llama-server's greedy answers (3 cases) + llama-mtmd-cli on one case
# by scripts/make-vlm-gguf-fixtures.py (images / convert / refs).
#
#   --llama-cpp DIR  llama.cpp source tree with a native build in DIR/build/bin (llama-server, llama-mtmd-cli)
#                    (default $INFERD_VLM_LLAMA_CPP or
#                    ~/.cache/inferd/llamacpp-0.3.36/llama_cpp_python-0.3.36/vendor/llama.cpp)
#   --python PY      python with numpy, Pillow, torch, transformers, safetensors, sentencepiece, PyYAML
#                    (default $INFERD_VLM_PYTHON or /tmp/vlm-venv/bin/python, see daemon/tests/fixtures/vlm/README.md)
#   --out DIR        output folder (default daemon/tests/fixtures/vlm-gguf)
#
# Everything but llama-server's ports and temp dirs is fixed, and reruns give byte-identical files.
# Takes about a minute on 2 cores (most of it the converter's imports).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lcpp="${INFERD_VLM_LLAMA_CPP:-$HOME/.cache/inferd/llamacpp-0.3.36/llama_cpp_python-0.3.36/vendor/llama.cpp}"
py="${INFERD_VLM_PYTHON:-/tmp/vlm-venv/bin/python}"
out="$root/daemon/tests/fixtures/vlm-gguf"
fams=()
while [ $# -gt 0 ]; do
    case "$1" in
        --llama-cpp) lcpp="$2"; shift 2 ;;
        --python) py="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) fams+=("$1"); shift ;;
    esac
done
[ ${#fams[@]} -gt 0 ] || fams=(gemma3 qwen2_5_vl llava smolvlm)
for f in "${fams[@]}"; do
    case "$f" in gemma3|qwen2_5_vl|llava|smolvlm) ;; *) echo "unknown family $f" >&2; exit 2 ;; esac
done

for f in convert_hf_to_gguf.py tools/mtmd/legacy-models/llava_surgery_v2.py \
         tools/mtmd/legacy-models/convert_image_encoder_to_gguf.py build/bin/llama-server build/bin/llama-mtmd-cli; do
    [ -e "$lcpp/$f" ] || { echo "make-vlm-gguf-fixtures: $lcpp/$f missing" >&2; exit 1; }
done
"$py" -c "import numpy, PIL, torch, transformers, safetensors, sentencepiece, yaml" || {
    echo "make-vlm-gguf-fixtures: $py lacks a needed package" >&2; exit 1; }

helper="$root/scripts/make-vlm-gguf-fixtures.py"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$out"
"$py" "$helper" images "$out" "${fams[@]}"
"$py" "$helper" convert "$lcpp" "$root/daemon/tests/fixtures/vlm" "$out" "${fams[@]}"
"$py" "$helper" refs "$lcpp" "$out" "${fams[@]}"
du -cb "$out"/*/* | tail -n 1
