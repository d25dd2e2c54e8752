#!/usr/bin/env python3
"""Cross-check scripts/convert-tiny-gguf.py against llama.cpp's own convert_hf_to_gguf.py.

Runs the real converter (--outtype f32) on each tiny fixture directory into a temporary folder and
compares its output with our file, metadata key by key (name, type, value, order) and tensor by tensor
(name, type, shape, bytes, order). Needs torch and transformers, so run it from its own venv:

    pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d /tmp/lcpp
    tar xzf /tmp/lcpp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcpp
    python3 -m venv /tmp/lcpp-venv
    /tmp/lcpp-venv/bin/pip install torch==2.15.0 transformers==5.24.0 sentencepiece safetensors numpy pyyaml tqdm
    /tmp/lcpp-venv/bin/python scripts/crosscheck-tiny-gguf.py /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp

Two patches make the real converter run on these fixtures at all (see convert-tiny-gguf.py's header):
  - get_vocab_base_pre(): our vocabulary's check hash is unknown to it; answer "qwen2" then;
  - Phi3MiniModel.set_vocab: use the generic gpt2 BPE path (its GPT2Tokenizer branch).
Expected result: every file identical except gemma3, which differs only by our added
gemma3.attention.sliding_window_pattern key.
"""
import runpy
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT.parent / "shared" / "fixtures" / "tiny-models"
OURS = ROOT / "daemon" / "tests" / "fixtures" / "tiny-gguf"
NAMES = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3", "phi3"]
EXPECTED_EXTRA = {"gemma3": {"gemma3.attention.sliding_window_pattern"}}


def patch_converter(lcpp):
    sys.path.insert(0, str(lcpp))
    sys.path.insert(1, str(lcpp / "gguf-py"))
    import conversion.base as base
    import conversion.phi as phi

    original = base.TextModel.get_vocab_base_pre

    def vocab_pre(self, tokenizer):
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            return "qwen2"

    base.TextModel.get_vocab_base_pre = vocab_pre
    phi.Phi3MiniModel.set_vocab = base.TextModel._set_vocab_gpt2


def run_converter(lcpp, src, out):
    argv = sys.argv
    sys.argv = [str(lcpp / "convert_hf_to_gguf.py"), "--outtype", "f32", "--outfile", str(out), str(src)]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        sys.argv = argv


def describe(path):
    """(ordered list of (key, type names, value), ordered list of (name, type, shape, bytes))."""
    from gguf import GGUFReader
    r = GGUFReader(path)
    kvs = []
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        value = [bytes(f.parts[i]) if f.types[-1].name == "STRING" else f.parts[i].tobytes() for i in f.data]
        kvs.append((f.name, tuple(t.name for t in f.types), value))
    tensors = [(t.name, t.tensor_type.name, tuple(int(n) for n in t.shape), t.data.tobytes()) for t in r.tensors]
    return kvs, tensors


def main():
    lcpp = Path(sys.argv[1]).resolve()
    patch_converter(lcpp)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in NAMES:
            ref_path = Path(tmp) / f"{name}.gguf"
            run_converter(lcpp, SRC / name, ref_path)
            ref_kv, ref_t = describe(ref_path)
            our_kv, our_t = describe(OURS / f"{name}.gguf")
            extra = EXPECTED_EXTRA.get(name, set())
            our_kv_cmp = [kv for kv in our_kv if kv[0] not in extra]
            problems = []
            if [k for k, _, _ in our_kv if k in extra] != sorted(extra):
                problems.append(f"expected extra keys {sorted(extra)} missing")
            if our_kv_cmp != ref_kv:
                ours_d, ref_d = {k: (t, v) for k, t, v in our_kv_cmp}, {k: (t, v) for k, t, v in ref_kv}
                for k in sorted(set(ours_d) | set(ref_d)):
                    if ours_d.get(k) != ref_d.get(k):
                        problems.append(f"key {k} differs")
                if not problems:
                    problems.append("key order differs")
            if our_t != ref_t:
                for a, b in zip(our_t, ref_t):
                    if a != b:
                        problems.append(f"tensor {a[0]} / {b[0]} differs")
                if len(our_t) != len(ref_t):
                    problems.append(f"tensor count {len(our_t)} vs {len(ref_t)}")
            same_bytes = ref_path.read_bytes() == (OURS / f"{name}.gguf").read_bytes()
            status = "FAIL " + "; ".join(problems) if problems else (
                "identical file" if same_bytes else f"same keys and tensors, plus {sorted(extra)}")
            print(f"{name:10s} {len(ref_kv)} keys, {len(ref_t)} tensors: {status}", flush=True)
            failures += bool(problems)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
