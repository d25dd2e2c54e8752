#!/usr/bin/env python3
"""Write a random (but deterministic) LoRA adapter GGUF for a given base GGUF model.

Usage (numpy and the `gguf` package from PyPI, pinned; scripts/lora-gguf.sh makes this venv itself):
    python3 -m venv target/lora-venv
    target/lora-venv/bin/pip install --no-deps gguf==0.19.0 numpy==2.4.6 pyyaml==6.0.3
    target/lora-venv/bin/python scripts/make-lora-gguf.py --base BASE.gguf --out OUT.gguf \
        [--rank 8] [--alpha 16] [--type f32|f16|bf16|q8_0] [--seed 0] [--strength 0.08] [--name NAME]

What it reads from the base: general.architecture, <arch>.block_count and the shapes (ne) and value rms
of the projection matrices of every layer: those of blk.N.{attn_q, attn_k, attn_v, attn_qkv, attn_output,
ffn_gate, ffn_up, ffn_down}.weight that the base has (llama/qwen2/gemma3: the seven separate ones;
phi3: the fused attn_qkv and the fused gate+up ffn_up, plus attn_output and ffn_down). The header
is parsed directly (the vocabulary skipped) and only 256 rows of each projection are read, so any
base works, quantized in any type gguf can dequantize, and the 1.1 GB Qwen2.5-Coder-1.5B Q4_K_M takes
about 2 s.

What it writes: what llama.cpp's convert_lora_to_gguf.py writes (the llama.cpp vendored in the
llama-cpp-python 0.3.36 sdist), in the same order and with the same value types:
    general.architecture  str   the base's architecture (llama.cpp refuses a mismatch)
    general.type          str   "adapter"
    adapter.type          str   "lora"
    general.name          str   --name (default "<base file stem> random LoRA r<rank> seed <seed>")
    adapter.lora.alpha    f32   --alpha
    general.quantization_version u32 2
(no general.file_type: the converter's LoraModel replaces set_gguf_parameters and never writes it),
then per layer and projection, in the order above, two tensors:
    blk.N.<proj>.weight.lora_a   ne = [n_in, rank]   (numpy shape (rank, n_in))
    blk.N.<proj>.weight.lora_b   ne = [rank, n_out]  (numpy shape (n_out, rank))
where the base's blk.N.<proj>.weight has ne = [n_in, n_out]. That is what llama-adapter.cpp checks:
model ne[0] == a.ne[0], model ne[1] == b.ne[1], a.ne[1] == b.ne[0]; rank = b.ne[0].
Tensor types, as the converter picks them for --outtype: f32 -> F32, f16 -> F16, bf16 -> BF16,
q8_0 -> Q8_0 through gguf.quants.quantize; a tensor whose ne[0] is not a multiple of 32 cannot be
Q8_0 (blocks of 32 along a row) and falls back to F16, exactly like the converter's QuantError
fallback - so a rank-8 q8_0 adapter has Q8_0 lora_a and F16 lora_b tensors.

The values. llama.cpp adds scale * B (A x) after the base matmul, scale = adapter_scale * alpha /
rank. Here A ~ N(0, 1/n_in) (so A x has about the rms of x per component) and, per matrix,
B ~ N(0, (strength * rms_W * sqrt(n_in) * sqrt(rank) / alpha)^2), where rms_W is the rms of the base
matrix's values (dequantized by gguf from 256 evenly spaced rows, rounded to 4 significant digits).
Then alpha/rank * B A has an element rms of about strength * rms_W whatever rank and alpha are: at
adapter scale 1 every adapted projection gets a random rank-r perturbation of about `strength`
(default 0.08) times the size of its own weights. (Relative, because models differ: SmolLM2's
matrices have rms 1..10 / sqrt(n_in), Gemma 3's about 1 / sqrt(n_in).) With 0.08, on the test
prompts of scripts/lora-gguf.sh, most greedy tokens differ from the base model's (SmolLM2 135M ~90%,
Gemma 3 270M ~60%) while the text stays fluent-ish and the top1-top2 margins are no smaller than
the base's; 0.2 turns Gemma's output into garbage.
Each tensor has its own generator, numpy PCG64 seeded from SeedSequence([seed, layer, projection
index, 0 for A / 1 for B]), values drawn as float32 (standard_normal) and scaled in float32: the bytes
depend only on the seed, the arguments, the base's shapes and weights and the pinned numpy/gguf
versions (two runs give the same SHA-256; scripts/lora-gguf.sh files checks it against a manifest).
"""
import argparse
import hashlib
import math
import os
import struct
import sys

import numpy as np

import gguf

SAMPLE_ROWS = 256
STRENGTH = 0.08

# projection tensors adapted, in this order; the index is part of each tensor's seed
PROJECTIONS = ["attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
           12: "<d"}


def read_header(path):
    """(kv scalars and short arrays, {tensor name: ne}) from a GGUF v2/v3 header; big arrays skipped."""
    with open(path, "rb") as f:
        def take(fmt):
            n = struct.calcsize(fmt)
            b = f.read(n)
            if len(b) != n:
                raise ValueError(f"{path}: truncated GGUF header")
            return struct.unpack(fmt, b)[0]

        def string():
            return f.read(take("<Q")).decode("utf-8", errors="replace")

        def skip_string():
            f.seek(take("<Q"), 1)

        def value(vtype):
            if vtype in _SCALAR:
                return take(_SCALAR[vtype])
            if vtype == 8:
                return string()
            if vtype == 9:
                etype, n = take("<I"), take("<Q")
                if etype in _SCALAR:
                    if n > 4096:
                        f.seek(n * struct.calcsize(_SCALAR[etype]), 1)
                        return None
                    return [take(_SCALAR[etype]) for _ in range(n)]
                if etype == 8 and n > 4096:  # the vocabulary: skip, fast
                    for _ in range(n):
                        skip_string()
                    return None
                return [value(etype) for _ in range(n)]
            raise ValueError(f"{path}: unknown GGUF value type {vtype}")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = take("<I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} not supported")
        n_tensors, n_kv = take("<Q"), take("<Q")
        kv = {}
        for _ in range(n_kv):
            key = string()
            kv[key] = value(take("<I"))
        tensors = {}
        for _ in range(n_tensors):
            name = string()
            nd = take("<I")
            ne = [take("<Q") for _ in range(nd)]
            ttype = take("<I")
            offset = take("<Q")
            tensors[name] = (ne, ttype, offset)
        align = kv.get("general.alignment", 32)
        data_start = (f.tell() + align - 1) // align * align
    return kv, tensors, data_start


def weight_rms(base, data_start, ne, ttype, offset, n_rows=SAMPLE_ROWS):
    """rms of the base matrix's values, from up to n_rows evenly spaced rows, dequantized by gguf."""
    qtype = gguf.GGMLQuantizationType(ttype)
    block, tsize = gguf.GGML_QUANT_SIZES[qtype]
    row_bytes = ne[0] // block * tsize
    rows = np.unique(np.linspace(0, ne[1] - 1, min(ne[1], n_rows)).astype(np.int64))
    mm = np.memmap(base, dtype=np.uint8, mode="r", offset=data_start + offset, shape=(ne[1], row_bytes))
    w = gguf.quants.dequantize(np.ascontiguousarray(mm[rows]), qtype).astype(np.float64)
    return float(np.sqrt(np.mean(w * w)))


def plan(base):
    """arch, n_layer, [(layer, proj index, proj, n_in, n_out)] from the base header."""
    kv, tensors, data_start = read_header(base)
    arch = kv.get("general.architecture")
    if not arch:
        sys.exit(f"make-lora-gguf: {base}: no general.architecture")
    if kv.get("general.type", "model") != "model":
        sys.exit(f"make-lora-gguf: {base}: general.type is {kv.get('general.type')!r}, not a model")
    n_layer = kv.get(f"{arch}.block_count")
    if not isinstance(n_layer, int) or n_layer <= 0:
        sys.exit(f"make-lora-gguf: {base}: no {arch}.block_count")
    items = []
    for il in range(n_layer):
        found = []
        for pi, proj in enumerate(PROJECTIONS):
            t = tensors.get(f"blk.{il}.{proj}.weight")
            if t is None:
                continue
            ne, ttype, offset = t
            if len(ne) != 2:
                sys.exit(f"make-lora-gguf: blk.{il}.{proj}.weight has ne {ne}, not a matrix "
                         "(mixture-of-experts or other layouts are not handled)")
            rms = weight_rms(base, data_start, ne, ttype, offset)
            items.append((il, pi, proj, int(ne[0]), int(ne[1]), rms))
            found.append(proj)
        if "attn_output" not in found or "ffn_down" not in found or \
                not ({"attn_q", "attn_k", "attn_v"} <= set(found) or "attn_qkv" in found):
            sys.exit(f"make-lora-gguf: layer {il} of {base} lacks the usual projections (has {found})")
    extra = [n for n in tensors if n.startswith(f"blk.{n_layer}.")]
    if extra:
        sys.exit(f"make-lora-gguf: {base} has tensors past block_count {n_layer}: {extra[:3]}")
    return arch, n_layer, items


def draw(seed, il, pi, which, shape, std):
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, il, pi, which])))
    return rng.standard_normal(size=shape, dtype=np.float32) * np.float32(std)


def encode(arr, qtype):
    """(data, raw_dtype) as the converter stores it; Q8_0 falls back to F16 where it cannot apply."""
    if qtype == gguf.GGMLQuantizationType.F32:
        return arr.astype(np.float32), gguf.GGMLQuantizationType.F32
    if qtype == gguf.GGMLQuantizationType.F16:
        return arr.astype(np.float16), gguf.GGMLQuantizationType.F16
    try:
        return gguf.quants.quantize(arr, qtype), qtype
    except gguf.QuantError:
        return arr.astype(np.float16), gguf.GGMLQuantizationType.F16


TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "bf16": gguf.GGMLQuantizationType.BF16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the base model GGUF (only its header is read)")
    ap.add_argument("--out", required=True, help="the adapter GGUF to write (OUT.part, then renamed)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--type", choices=sorted(TYPES), default="f16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strength", type=float, default=STRENGTH,
                    help="element rms of alpha/rank*B*A relative to the base matrix's (default %(default)s)")
    ap.add_argument("--name", help="general.name (default: from the base file name, rank and seed)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    if a.rank <= 0 or a.alpha <= 0 or a.seed < 0:
        sys.exit("make-lora-gguf: --rank and --alpha must be > 0, --seed >= 0")

    arch, n_layer, items = plan(a.base)
    stem = os.path.basename(a.base)
    stem = stem[: -len(".gguf")] if stem.endswith(".gguf") else stem
    name = a.name or f"{stem} random LoRA r{a.rank} seed {a.seed}"
    qtype = TYPES[a.type]

    part = a.out + ".part"
    w = gguf.GGUFWriter(part, arch)  # general.architecture first, as the converter
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_name(name)
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(a.alpha))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    types_used = {}
    n_params = 0
    for il, pi, proj, n_in, n_out, rms in items:
        rms = float("%.4g" % rms)  # the base's value rms, 4 significant digits
        std_b = a.strength * rms * math.sqrt(n_in) * math.sqrt(a.rank) / a.alpha
        lora_a = draw(a.seed, il, pi, 0, (a.rank, n_in), 1.0 / math.sqrt(n_in))
        lora_b = draw(a.seed, il, pi, 1, (n_out, a.rank), std_b)
        for suffix, arr in (("lora_a", lora_a), ("lora_b", lora_b)):
            data, dt = encode(arr, qtype)
            w.add_tensor(f"blk.{il}.{proj}.weight.{suffix}", data, raw_dtype=dt)
            key = f"{suffix} {dt.name}"
            types_used[key] = types_used.get(key, 0) + 1
            n_params += arr.size
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    os.replace(part, a.out)
    if not a.quiet:
        h = hashlib.sha256()
        with open(a.out, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        projs = sorted({it[2] for it in items}, key=PROJECTIONS.index)
        print(f"make-lora-gguf: wrote {a.out}: {arch}, {n_layer} layers x {len(projs)} projections "
              f"({', '.join(projs)}), rank {a.rank}, alpha {a.alpha:g}, {n_params} values, "
              f"tensor types {types_used}, sha256 {h.hexdigest()}", file=sys.stderr)


if __name__ == "__main__":
    main()
