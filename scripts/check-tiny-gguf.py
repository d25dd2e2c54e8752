#!/usr/bin/env python3
"""Check the tiny GGUF fixtures against transformers' reference logits, reading ONLY the GGUF.

For each daemon/tests/fixtures/tiny-gguf/<name>.gguf this runs a float64 numpy forward pass that uses
nothing but the GGUF file (tensors and metadata) and follows llama.cpp's conventions for that
architecture, undoing none of the converter's transformations. It compares the logits with
../shared/fixtures/tiny-models/<name>/reference.json (produced by transformers from the original HF
files): the last-position logits of the three `sequences` must agree within 1e-4 * max|logit|; the
7-token sequence's logits at every position and the two chat prompts are checked the same way.
It also checks the tokenizer metadata against tokenizer.json / tokenizer_config.json.

    /tmp/gguf-venv/bin/python scripts/check-tiny-gguf.py [--gguf DIR] [--ref DIR] [NAME ...]

So this file doubles as an executable statement of what a GGUF loader has to do. The conventions:

Tensors (GGUF lists dimensions fastest-first, "ne"; numpy, and this script, see them reversed, so a
matrix with ne = {n_in, n_out} is a numpy [n_out, n_in] array and y = W @ x):
  token_embd [n_vocab, n_embd]; output [n_vocab, n_embd], absent when tied (llama, gemma3 here):
  then token_embd is the output head. output_norm [n_embd].
  blk.N.attn_norm, blk.N.ffn_norm [n_embd]: the pre-attention and pre-MLP RMSNorm weights.
  blk.N.attn_q [n_head*hd, n_embd], attn_k / attn_v [n_kv*hd, n_embd], attn_output [n_embd, n_head*hd],
  optional .bias vectors on q/k/v (qwen2).
  blk.N.ffn_gate / ffn_up [n_ff, n_embd], ffn_down [n_embd, n_ff]; y = down(act(gate x) * (up x)).
  qwen3 / qwen3moe / gemma3: blk.N.attn_q_norm, attn_k_norm [hd]: RMSNorm over each head's q and k,
  after the projection (and bias) and BEFORE RoPE.
  phi3: blk.N.attn_qkv [(n_head + 2*n_kv)*hd, n_embd], rows q | k | v, and blk.N.ffn_up [2*n_ff, n_embd],
  rows gate | up (ggml's swiglu: silu of the FIRST half times the second half); no ffn_gate tensor.
  qwen3moe: blk.N.ffn_gate_inp [n_expert, n_embd] (router), and 3-D stacked experts
  ffn_gate_exps / ffn_up_exps [n_expert, n_ff_exp, n_embd] and ffn_down_exps [n_expert, n_embd, n_ff_exp]
  (GGUF ne {n_embd, n_ff_exp, n_expert} and {n_ff_exp, n_embd, n_expert}); no dense ffn_* tensors.
  gemma3: blk.N.post_attention_norm (applied to the attention output before the residual add),
  blk.N.ffn_norm (pre-MLP), blk.N.post_ffw_norm (applied to the MLP output before the add).

RMSNorm is always y = x / sqrt(mean(x^2) + eps) * w, eps = <arch>.attention.layer_norm_rms_epsilon.
No architecture adds 1 at run time: for gemma3 the converter already stored 1 + w_hf in EVERY norm
tensor (attn_norm, post_attention_norm, ffn_norm, post_ffw_norm, attn_q_norm, attn_k_norm, output_norm).

RoPE (n_rot = <arch>.rope.dimension_count, else the head dim; theta_i = pos * base^(-2i/n_rot)):
  llama (also Mistral, which is general.architecture "llama"): "normal" layout - rotate the ADJACENT
  pairs (x[2i], x[2i+1]). The converter permuted the rows of attn_q and attn_k so this equals HF's
  rotate-half on the original weights. (So: a GGUF llama loader must NOT permute again; an HF-safetensors
  loader uses rotate-half, or permutes the same way.)
  qwen2, qwen3, qwen3moe, gemma3, phi3: NEOX layout - rotate the pairs (x[i], x[i + n_rot/2]),
  HF's rotate-half, on unpermuted weights.
  base = <arch>.rope.freq_base (llama.cpp's default when absent: 10000). gemma3 sliding-window layers use
  <arch>.rope.freq_base_swa instead (default 10000); its full-attention layers use freq_base.

Attention: causal, grouped: query head h reads KV head h // (n_head / n_kv), n_kv from
<arch>.attention.head_count_kv. head dim hd = <arch>.attention.key_length when present, else
n_embd / head_count (qwen2 and phi3 files have no key_length). Scores are scaled by 1/sqrt(hd) for all
seven (for gemma3 llama.cpp uses 1/sqrt(key_length) - query_pre_attn_scalar is not in the GGUF; it
equals hd here and in Gemma 3 except 27B).

gemma3 specifics: the embedding row is multiplied by sqrt(n_embd) (float32 value); MLP activation
is gelu with the tanh approximation; no soft-capping unless <arch>.final_logit_softcapping is present.
Sliding window: n_swa = gemma3.attention.sliding_window; a key at position j is visible to a query at
position i in a sliding layer iff 0 <= i - j < n_swa (16 keys including itself). Which layers slide comes
from gemma3.attention.sliding_window_pattern: a per-layer bool array (true = sliding; our files carry
[true, false]); if it were a uint32 n, layer l slides iff l % n < n - 1; if absent, llama.cpp assumes
n = 6 (what real Gemma 3 GGUFs rely on). Without the key both layers of this 2-layer model would slide;
the script reports what that would do to the logits.

qwen3moe routing (llama.cpp's build_moe_ffn with softmax gating and weight normalisation, which its
qwen3moe graph always enables; there is no norm_topk_prob key): p = softmax(ffn_gate_inp @ x) over
<arch>.expert_count experts; keep the <arch>.expert_used_count largest; divide them by their sum; output
= sum over kept e of p_e * down_e(silu(gate_e x) * (up_e x)). The expert width is
<arch>.expert_feed_forward_length (also the middle dimension of the *_exps tensors).

Activation: silu everywhere except gemma3 (gelu tanh). Output: logits = output_norm(x) @ output.T.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGUFValueType

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GGUF = ROOT / "daemon" / "tests" / "fixtures" / "tiny-gguf"
DEFAULT_REF = ROOT.parent / "shared" / "fixtures" / "tiny-models"
NAMES = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3", "phi3"]
NEOX_ARCHS = {"qwen2", "qwen3", "qwen3moe", "gemma3", "phi3"}  # "normal" (adjacent pairs): llama
TOLERANCE = 1e-4  # relative to max |logit| of the reference row


def read_metadata(reader):
    """GGUF key/value pairs as plain Python values (arrays as lists)."""
    def scalar(field, part):
        vt = field.types[-1]
        raw = field.parts[part]
        if vt == GGUFValueType.STRING:
            return bytes(raw).decode("utf-8")
        value = raw.tolist()[0]
        return bool(value) if vt == GGUFValueType.BOOL else value

    meta = {}
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            meta[field.name] = [scalar(field, i) for i in field.data]
        else:
            meta[field.name] = scalar(field, field.data[0])
    return meta


class Model:
    """Everything the forward pass needs, read from one GGUF file."""

    def __init__(self, path):
        reader = GGUFReader(path)
        self.meta = read_metadata(reader)
        for t in reader.tensors:
            assert t.tensor_type.name == "F32", (t.name, t.tensor_type.name)
        self.t = {t.name: np.asarray(t.data, dtype=np.float64) for t in reader.tensors}
        m, a = self.meta, self.meta["general.architecture"]
        self.arch = a
        self.n_layer = m[f"{a}.block_count"]
        self.n_embd = m[f"{a}.embedding_length"]
        self.n_head = m[f"{a}.attention.head_count"]
        self.n_kv = m.get(f"{a}.attention.head_count_kv", self.n_head)
        self.hd = m.get(f"{a}.attention.key_length", self.n_embd // self.n_head)
        self.n_rot = m.get(f"{a}.rope.dimension_count", self.hd)
        self.eps = m[f"{a}.attention.layer_norm_rms_epsilon"]
        self.base = m.get(f"{a}.rope.freq_base", 10000.0)
        self.base_swa = m.get(f"{a}.rope.freq_base_swa", 10000.0)
        self.neox = a in NEOX_ARCHS
        self.n_swa = m.get(f"{a}.attention.sliding_window", 0)
        self.softcap = m.get(f"{a}.final_logit_softcapping")
        self.swa_layers = self.sliding_layers(m.get(f"{a}.attention.sliding_window_pattern"))

    def sliding_layers(self, pattern):
        """Per-layer 'uses the sliding window' flags, as llama.cpp's gemma3 loader derives them."""
        if self.arch != "gemma3" or not self.n_swa:
            return [False] * self.n_layer  # phi3 writes sliding_window 0; llama.cpp ignores phi3 SWA
        if isinstance(pattern, list):
            return [bool(v) for v in pattern]
        n = 6 if pattern is None else pattern  # llama.cpp's default for gemma3
        return [n == 0 or (il % n < n - 1) for il in range(self.n_layer)]

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, base):
        """x [heads, T, hd]; rotate the first n_rot dims by position."""
        half = self.n_rot // 2
        inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / self.n_rot)
        ang = pos[:, None] * inv[None, :]  # [T, half]
        cos, sin = np.cos(ang), np.sin(ang)
        out = x.copy()
        if self.neox:  # pairs (i, i + n_rot/2)
            a, b = x[..., :half], x[..., half:self.n_rot]
            out[..., :half] = a * cos - b * sin
            out[..., half:self.n_rot] = a * sin + b * cos
        else:  # "normal": pairs (2i, 2i + 1)
            a, b = x[..., 0:self.n_rot:2], x[..., 1:self.n_rot:2]
            out[..., 0:self.n_rot:2] = a * cos - b * sin
            out[..., 1:self.n_rot:2] = a * sin + b * cos
        return out

    def lin(self, x, name):
        y = x @ self.t[name + ".weight"].T
        return y + self.t[name + ".bias"] if name + ".bias" in self.t else y

    def act(self, x):
        if self.arch == "gemma3":  # gelu, tanh approximation
            return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
        return x / (1.0 + np.exp(-x))  # silu

    def mlp(self, x, p):
        if p + ".ffn_gate.weight" in self.t:
            gate, up = self.lin(x, p + ".ffn_gate"), self.lin(x, p + ".ffn_up")
        else:  # phi3: fused rows gate | up in ffn_up
            gu = self.lin(x, p + ".ffn_up")
            gate, up = np.split(gu, 2, axis=-1)
        return self.lin(self.act(gate) * up, p + ".ffn_down")

    def moe(self, x, p):
        a = self.arch
        k = self.meta[f"{a}.expert_used_count"]
        assert self.meta[f"{a}.expert_count"] == self.t[p + ".ffn_gate_inp.weight"].shape[0]
        gate_e, up_e, down_e = (self.t[f"{p}.ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
        assert gate_e.shape[1] == self.meta[f"{a}.expert_feed_forward_length"]
        logits = x @ self.t[p + ".ffn_gate_inp.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.zeros_like(x)
        for i in range(x.shape[0]):
            top = np.argsort(-probs[i], kind="stable")[:k]
            weights = probs[i, top] / probs[i, top].sum()
            for e, we in zip(top, weights):
                h = self.act(gate_e[e] @ x[i]) * (up_e[e] @ x[i])
                out[i] += we * (down_e[e] @ h)
        return out

    def forward(self, ids, swa_layers=None):
        swa_layers = self.swa_layers if swa_layers is None else swa_layers
        T = len(ids)
        pos = np.arange(T, dtype=np.float64)
        nh, nkv, hd = self.n_head, self.n_kv, self.hd
        x = self.t["token_embd.weight"][ids]
        if self.arch == "gemma3":
            x = x * np.float64(np.float32(np.sqrt(self.n_embd)))
        qi, kj = np.arange(T)[:, None], np.arange(T)[None, :]
        for il in range(self.n_layer):
            p = f"blk.{il}"
            h = self.rms(x, self.t[p + ".attn_norm.weight"])
            if p + ".attn_qkv.weight" in self.t:  # phi3
                q, k, v = np.split(self.lin(h, p + ".attn_qkv"), [nh * hd, (nh + nkv) * hd], axis=1)
            else:
                q, k, v = (self.lin(h, p + n) for n in (".attn_q", ".attn_k", ".attn_v"))
            q = q.reshape(T, nh, hd).transpose(1, 0, 2)
            k = k.reshape(T, nkv, hd).transpose(1, 0, 2)
            v = v.reshape(T, nkv, hd).transpose(1, 0, 2)
            if p + ".attn_q_norm.weight" in self.t:
                q = self.rms(q, self.t[p + ".attn_q_norm.weight"])
                k = self.rms(k, self.t[p + ".attn_k_norm.weight"])
            base = self.base_swa if swa_layers[il] else self.base
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            k = np.repeat(k, nh // nkv, axis=0)
            v = np.repeat(v, nh // nkv, axis=0)
            s = (q @ k.transpose(0, 2, 1)) / np.sqrt(hd)
            visible = kj <= qi
            if swa_layers[il]:
                visible &= (qi - kj) < self.n_swa
            s = np.where(visible[None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = self.lin((s @ v).transpose(1, 0, 2).reshape(T, nh * hd), p + ".attn_output")
            if self.arch == "gemma3":
                x = x + self.rms(o, self.t[p + ".post_attention_norm.weight"])
                m = self.mlp(self.rms(x, self.t[p + ".ffn_norm.weight"]), p)
                x = x + self.rms(m, self.t[p + ".post_ffw_norm.weight"])
            else:
                x = x + o
                h = self.rms(x, self.t[p + ".ffn_norm.weight"])
                x = x + (self.moe(h, p) if p + ".ffn_gate_inp.weight" in self.t else self.mlp(h, p))
        x = self.rms(x, self.t["output_norm.weight"])
        head = self.t.get("output.weight", self.t["token_embd.weight"])
        logits = x @ head.T
        if self.softcap:
            logits = np.tanh(logits / self.softcap) * self.softcap
        return logits


def rel_diff(got, want):
    want = np.asarray(want, dtype=np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def check_tokenizer(meta, ref_dir):
    """The tokenizer.* metadata against tokenizer.json / tokenizer_config.json / config.json."""
    tok = json.loads((ref_dir / "tokenizer.json").read_text(encoding="utf-8"))
    tcfg = json.loads((ref_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg = json.loads((ref_dir / "config.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    vocab.update({a["content"]: a["id"] for a in tok["added_tokens"]})
    by_id = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in by_id] == list(range(len(by_id))), "tokenizer.json ids not dense"
    special_ids = {a["id"] for a in tok["added_tokens"] if a["special"]}
    want_types = [3 if i in special_ids else 1 for i in range(len(by_id))]  # CONTROL / NORMAL
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    problems = []
    expect = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": by_id,
        "tokenizer.ggml.token_type": want_types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": cfg["bos_token_id"],
        "tokenizer.ggml.eos_token_id": vocab[tcfg["eos_token"]],
        "tokenizer.ggml.padding_token_id": vocab[tcfg["pad_token"]],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": tcfg["chat_template"],
    }
    for key, want in expect.items():
        if meta.get(key) != want:
            problems.append(key)
    extra = sorted(k for k in meta if k.startswith("tokenizer.") and k not in expect)
    if extra:
        problems.append(f"unexpected keys {extra}")
    return problems, len(by_id), len(merges)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--ref", type=Path, default=DEFAULT_REF)
    ap.add_argument("names", nargs="*", default=NAMES)
    args = ap.parse_args()
    failed = []
    for name in args.names:
        model = Model(args.gguf / f"{name}.gguf")
        ref = json.loads((args.ref / name / "reference.json").read_text())
        worst_last, worst_other, worst_abs = 0.0, 0.0, 0.0
        parts = []
        for seq in ref["sequences"]:
            logits = model.forward(seq["input_ids"])
            d = rel_diff(logits[-1], seq["last_logits"])
            worst_last = max(worst_last, d)
            worst_abs = max(worst_abs, float(np.abs(logits[-1] - np.asarray(seq["last_logits"])).max()))
            parts.append(f"{seq['name']} {d:.1e}")
            if "all_logits" in seq:
                worst_other = max(worst_other, max(rel_diff(logits[i], row)
                                                   for i, row in enumerate(seq["all_logits"])))
        for chat in ref["chat"]:
            worst_other = max(worst_other, rel_diff(model.forward(chat["input_ids"])[-1], chat["last_logits"]))
        tok_problems, n_tok, n_merges = check_tokenizer(model.meta, args.ref / name)
        ok = worst_last < TOLERANCE and worst_other < TOLERANCE and not tok_problems
        print(f"{name:10s} arch={model.arch:8s} rope={'neox' if model.neox else 'normal'} "
              f"max rel diff, last logits: {worst_last:.2e} ({', '.join(parts)}; abs {worst_abs:.1e}); "
              f"all len7 positions + chat prompts: {worst_other:.2e}; "
              f"tokenizer: {n_tok} tokens, {n_merges} merges, "
              f"{'ok' if not tok_problems else 'MISMATCH ' + ', '.join(tok_problems)} "
              f"-> {'PASS' if ok else 'FAIL'}")
        if model.arch == "gemma3":
            # What llama.cpp would do without our sliding_window_pattern key (its default n = 6).
            default = [il % 6 < 5 for il in range(model.n_layer)]
            long_seq = ref["sequences"][-1]
            d = rel_diff(model.forward(long_seq["input_ids"], swa_layers=default)[-1], long_seq["last_logits"])
            print(f"{'':10s} (without gemma3.attention.sliding_window_pattern llama.cpp would treat layers "
                  f"{[il for il, s in enumerate(default) if s]} as sliding: {long_seq['name']} rel diff {d:.2e})")
        if not ok:
            failed.append(name)
    print(f"{len(args.names) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
