#!/usr/bin/env python3
"""Convert the seven tiny HF fixture models into F32 GGUF files, the way llama.cpp's converter does.

Input:  ../shared/fixtures/tiny-models/<dir>/  (config.json, model.safetensors, tokenizer.json,
        tokenizer_config.json, generation_config.json) - read only.
Output: daemon/tests/fixtures/tiny-gguf/<dir>.gguf, every tensor F32.

Usage (numpy, safetensors and the `gguf` package from PyPI; no torch, no transformers):
    python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf numpy safetensors
    /tmp/gguf-venv/bin/python scripts/convert-tiny-gguf.py [--src DIR] [--out DIR] [NAME ...]

What "the way llama.cpp's converter does" means here
----------------------------------------------------
The reference is `convert_hf_to_gguf.py` (with its `conversion/` package and gguf-py) from the llama.cpp
source vendored in the PyPI sdist of llama-cpp-python 0.3.36. This script re-implements, for these seven
architectures only, what that converter does with `--outtype f32`: the same tensor names, the same
transformations, the same metadata keys with the same value types, in the same order. The gguf package
is only used as a file writer and for the cosmetic `general.name` / `general.size_label` heuristics.

How it was checked: the real converter was run on every fixture directory (torch 2.15.0 and
transformers 5.24.0 in a separate venv) through scripts/crosscheck-tiny-gguf.py, which then compares
its output with this script's output key by key and tensor by tensor. All seven files are identical
except for the one deliberate addition described below; the real converter needed two small patches
to run at all, also described below.

Deviations from the real converter, all deliberate
--------------------------------------------------
1. tokenizer.ggml.pre = "qwen2". The converter picks the pre-tokenizer name by hashing the token ids of
   a fixed test string; our locally trained vocabulary gives an unknown hash (77e6455a...), so the real
   converter stops with "BPE pre-tokenizer was not recognized". The tokenizer's Split regex is exactly
   Qwen2's, and llama.cpp's "qwen2" pre-tokenizer uses that regex, so "qwen2" is the name it would
   write had the hash been registered. (Patched into the real converter for the cross-check.)
2. phi3 vocabulary: the converter's Phi-3 class only handles a SentencePiece tokenizer.model, or
   tokenizer_class "GPT2Tokenizer" (then it uses the generic gpt2 BPE path). Our tokenizer_config says
   "PreTrainedTokenizerFast" and there is no tokenizer.model, so the real converter fails. We write the
   generic gpt2 BPE vocabulary, as its GPT2Tokenizer branch would. (Patched likewise.)
3. gemma3: we ADD `gemma3.attention.sliding_window_pattern` = [true, false] (a per-layer bool array,
   true = sliding-window layer), built from config.json `layer_types`. The Gemma 3 converter does not
   write this key; llama.cpp then assumes Gemma 3's pattern of 6 (layers 0-4 of every 6 sliding), which
   for a 2-layer model makes BOTH layers sliding, with the local RoPE base, and the logits no longer
   match transformers. llama.cpp reads this key when present (load_swa_pattern), in exactly this
   array form, which other converters (e.g. exaone, granite, mellum) already write.
Everything else is what the converter writes.
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

import gguf

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SRC = ROOT.parent / "shared" / "fixtures" / "tiny-models"
DEFAULT_OUT = ROOT / "daemon" / "tests" / "fixtures" / "tiny-gguf"
NAMES = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3", "phi3"]

# config.json architectures[0] -> GGUF general.architecture. Mistral is converted by the converter's
# Llama class and is plain "llama" in GGUF.
GGUF_ARCH = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}

# HF tensor name (without "model.layers.N." and without ".weight"/".bias") -> GGUF name (without
# "blk.N." and the suffix). Gemma 3 has four norms per layer, so its post_attention_layernorm is
# NOT ffn_norm: see GEMMA3_LAYER_NAMES.
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv",       # phi3: rows q | k | v, kept fused
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",      # qwen3, qwen3moe, gemma3
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",  # the pre-MLP norm in these architectures
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",           # phi3: rows gate | up, kept fused under the ffn_up name
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",             # qwen3moe router [n_expert, n_embd]
}
GEMMA3_LAYER_NAMES = dict(LAYER_NAMES, **{
    "post_attention_layernorm": "post_attention_norm",  # applied to the attention output
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",      # applied to the MLP output
})
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def permute_for_llama_rope(w, n_head):
    """The converter's LlamaModel.permute: within each head, reorder the rows of q_proj/k_proj so that
    HF's rotate-half pairs (i, i + d/2) become adjacent pairs (2i, 2i + 1), the layout ggml's "normal"
    RoPE rotates. New row 2i is old row i, new row 2i+1 is old row d/2 + i (d = head_dim)."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
             .swapaxes(1, 2)
             .reshape(w.shape))


def convert_tensors(cfg, weights, arch):
    """Yield (gguf_name, float32 array) in the converter's order: HF names sorted, one output per input
    except the MoE experts, which are emitted stacked once the last expert tensor of a layer is seen."""
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    layer_names = GEMMA3_LAYER_NAMES if arch == "gemma3" else LAYER_NAMES
    n_expert = cfg.get("num_local_experts", cfg.get("num_experts"))
    pending_experts = {}  # layer -> {hf name: array}

    for name in sorted(weights):  # the converter indexes safetensors tensors sorted by name
        w = weights[name]
        assert w.dtype == np.float32, (name, w.dtype)

        if arch == "gemma3" and name == "lm_head.weight":
            continue  # the Gemma converters drop lm_head (tied); our gemma3 has none anyway

        # llama/mistral: q and k rows permuted for ggml's adjacent-pair RoPE. k uses the KV head count.
        if arch == "llama":
            if name.endswith("self_attn.q_proj.weight"):
                w = permute_for_llama_rope(w, n_head)
            elif name.endswith("self_attn.k_proj.weight"):
                w = permute_for_llama_rope(w, n_kv)

        # gemma3: every RMSNorm weight (input, post_attention, pre/post_feedforward, q_norm, k_norm and
        # the final norm) gets +1, since Gemma computes x * (1 + w) and ggml computes x * w.
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + np.float32(1.0)

        if name in GLOBAL_NAMES:
            yield GLOBAL_NAMES[name], w
            continue

        parts = name.split(".")
        assert parts[:2] == ["model", "layers"], name
        bid = int(parts[2])
        rest, suffix = ".".join(parts[3:-1]), parts[-1]

        if ".experts." in name:
            # qwen3moe: model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight, collected per layer
            # and stacked along a new leading expert axis: numpy [E, n_ff_exp, n_embd] for gate/up
            # and [E, n_embd, n_ff_exp] for down (GGUF ne = reversed: {n_embd, n_ff_exp, E} etc.).
            layer = pending_experts.setdefault(bid, {})
            layer[name] = w
            if len(layer) == n_expert * 3:
                for proj, out in (("down_proj", "ffn_down_exps"), ("gate_proj", "ffn_gate_exps"),
                                  ("up_proj", "ffn_up_exps")):
                    stack = [layer.pop(f"model.layers.{bid}.mlp.experts.{e}.{proj}.weight")
                             for e in range(n_expert)]
                    yield f"blk.{bid}.{out}.weight", np.stack(stack, axis=0)
            continue

        if rest not in layer_names:
            raise SystemExit(f"no GGUF name for tensor {name}")
        yield f"blk.{bid}.{layer_names[rest]}.{suffix}", w

    leftover = [k for layer in pending_experts.values() for k in layer]
    if leftover:
        raise SystemExit(f"unprocessed expert tensors: {leftover}")


def add_hparams(w, cfg, arch, hf_arch):
    """Model hyper-parameters, in the order and with the types the converter writes them."""
    a = arch
    rope = cfg.get("rope_parameters") or {}
    rope_full = rope.get("full_attention", rope)  # gemma3 nests rope_parameters per layer type
    theta = rope_full.get("rope_theta", cfg.get("rope_theta"))
    head_dim = cfg.get("head_dim")  # only written (key/value_length) when config.json has it

    if arch == "phi3":
        # Phi3MiniModel.set_gguf_parameters does not call the generic one.
        n_embd, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
        rot_pct = rope.get("partial_rotary_factor", 1.0)
        w.add_uint32(f"{a}.context_length", cfg["max_position_embeddings"])
        w.add_uint32(f"{a}.rope.scaling.original_context_length", cfg["original_max_position_embeddings"])
        w.add_uint32(f"{a}.embedding_length", n_embd)
        w.add_uint32(f"{a}.feed_forward_length", cfg["intermediate_size"])
        w.add_uint32(f"{a}.block_count", cfg["num_hidden_layers"])
        w.add_uint32(f"{a}.attention.head_count", n_head)
        w.add_uint32(f"{a}.attention.head_count_kv", cfg["num_key_value_heads"])
        w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
        w.add_uint32(f"{a}.rope.dimension_count", int(rot_pct * n_embd) // n_head)
        w.add_float32(f"{a}.rope.freq_base", theta)
        w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))
        # 0 when config.json has sliding_window null (the converter's marker for "not Phi-4")
        w.add_uint32(f"{a}.attention.sliding_window", cfg.get("sliding_window") or 0)
        return

    # TextModel.set_gguf_parameters (shared by llama, qwen2, qwen3, qwen3moe, gemma3)
    w.add_uint32(f"{a}.block_count", cfg["num_hidden_layers"])
    w.add_uint32(f"{a}.context_length", cfg["max_position_embeddings"])
    w.add_uint32(f"{a}.embedding_length", cfg["hidden_size"])
    w.add_uint32(f"{a}.feed_forward_length", cfg["intermediate_size"])
    w.add_uint32(f"{a}.attention.head_count", cfg["num_attention_heads"])
    w.add_uint32(f"{a}.attention.head_count_kv", cfg["num_key_value_heads"])
    # rope_type "default" writes no rope.scaling.* key (the converter only logs "Unknown RoPE type")
    assert rope_full.get("rope_type", "default") == "default", rope_full
    w.add_float32(f"{a}.rope.freq_base", theta)
    if "sliding_attention" in rope:  # gemma3: the local (sliding-window layer) RoPE base
        w.add_float32(f"{a}.rope.freq_base_swa", rope["sliding_attention"]["rope_theta"])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    n_expert = cfg.get("num_local_experts", cfg.get("num_experts"))
    if n_expert is not None:
        w.add_uint32(f"{a}.expert_count", n_expert)
        w.add_uint32(f"{a}.expert_used_count", cfg["num_experts_per_tok"])
    if head_dim is not None:
        w.add_uint32(f"{a}.attention.key_length", head_dim)
        w.add_uint32(f"{a}.attention.value_length", head_dim)
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))

    if arch == "llama":  # LlamaModel adds these two
        w.add_uint32(f"{a}.vocab_size", cfg["vocab_size"])
        w.add_uint32(f"{a}.rope.dimension_count", head_dim or cfg["hidden_size"] // cfg["num_attention_heads"])
    if arch == "qwen3moe":  # Qwen2MoeModel adds the expert FFN width
        w.add_uint32(f"{a}.expert_feed_forward_length", cfg["moe_intermediate_size"])
    if arch == "gemma3":
        # Gemma3Model re-writes context_length, head_count, rms eps, key/value_length, freq_base and
        # head_count_kv with the same values (an overwrite keeps the first position, so nothing moves),
        # then adds the window. No final_logit_softcapping key: config.json has null.
        assert not cfg.get("final_logit_softcapping") and cfg.get("attn_logit_softcapping") is None
        if cfg.get("sliding_window_pattern") != 1:
            w.add_uint32(f"{a}.attention.sliding_window", cfg["sliding_window"])
        # Deviation 3 (see the header): the per-layer pattern, true = sliding-window layer.
        w.add_array(f"{a}.attention.sliding_window_pattern",
                    [t == "sliding_attention" for t in cfg["layer_types"]])


def add_vocab(w, src, cfg):
    """The converter's gpt2 BPE path (_set_vocab_gpt2 + gguf.SpecialVocab) for this tokenizer."""
    tok = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    model = tok["model"]
    assert model["type"] == "BPE" and not model.get("byte_fallback"), "only byte-level BPE is handled"

    # Token list in id order: the BPE vocab plus the added tokens. Added tokens that are special (or look
    # like <|...|>) are CONTROL; the rest NORMAL; ids with no token would be "[PAD<i>]" UNUSED.
    by_id = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tok["added_tokens"]}
    tokens, types = [], []
    for i in range(cfg["vocab_size"]):
        if i in added:
            text = added[i]["content"]
            # (the converter re-encodes/decodes non-normalized added tokens; for <|...|> that is a no-op)
            special = added[i]["special"] or (text.startswith("<|") and text.endswith("|>"))
            tokens.append(text)
            types.append(int(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED))
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(int(gguf.TokenType.NORMAL))
        else:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))

    # Merges as "left right" strings; a space inside a part would be written as U+0120 (never happens
    # in a byte-level vocabulary, whose space is already "Ġ").
    merges = []
    for m in model["merges"]:
        pair = m.split(" ") if isinstance(m, str) else m
        assert len(pair) == 2
        merges.append(" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in p) for p in pair))

    # Special token ids, as SpecialVocab finds them: first the *_token strings of tokenizer_config.json
    # (looked up among the added tokens), then config.json's *_token_id for the types still missing.
    # For these fixtures: eos 1023 and pad 1021 from the first pass, bos 1021 from config.json
    # (bos_token is null in tokenizer_config.json, yet config.json has bos_token_id).
    special = {}
    kinds = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
    for kind in kinds:
        entry = tok_cfg.get(f"{kind}_token")
        content = entry.get("content") if isinstance(entry, dict) else entry
        if isinstance(content, str):
            tid = next((a["id"] for a in tok["added_tokens"] if a["content"] == content), None)
            if isinstance(tid, int):
                special.setdefault(kind, tid)
    for kind in kinds:
        tid = cfg.get(f"{kind}_token_id")
        if isinstance(tid, int) and tid < cfg["vocab_size"]:
            special.setdefault(kind, tid)

    # add_bos/add_eos: a ByteLevel post-processor adds nothing, so both are false; a bool
    # add_<kind>_token in tokenizer_config.json only fills a kind not yet decided.
    post = tok.get("post_processor") or {}
    add_special = {}
    for proc in post.get("processors", [post]):
        if proc.get("type") == "ByteLevel":
            add_special.setdefault("bos", False)
            add_special.setdefault("eos", False)
        elif proc:
            raise SystemExit(f"post-processor {proc.get('type')} not handled by this script")
    for kind in kinds:
        if isinstance(tok_cfg.get(f"add_{kind}_token"), bool):
            add_special.setdefault(kind, tok_cfg[f"add_{kind}_token"])

    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")  # deviation 1 (see the header)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)  # int32 array
    w.add_array("tokenizer.ggml.merges", merges)
    key_of = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
              "sep": "seperator_token_id", "pad": "padding_token_id", "cls": "cls_token_id",
              "mask": "mask_token_id"}  # "seperator" is gguf's spelling
    for kind, tid in special.items():
        w.add_uint32(f"tokenizer.ggml.{key_of[kind]}", tid)
    for kind, value in add_special.items():
        w.add_bool(f"tokenizer.ggml.add_{kind}_token", value)
    template = tok_cfg.get("chat_template")
    if template is None and (src / "chat_template.jinja").is_file():
        template = (src / "chat_template.jinja").read_text(encoding="utf-8")
    if template is not None:
        w.add_string("tokenizer.chat_template", template)


def convert(src, out_path):
    cfg = json.loads((src / "config.json").read_text())
    hf_arch = cfg["architectures"][0]
    arch = GGUF_ARCH[hf_arch]
    weights = load_file(str(src / "model.safetensors"))

    w = gguf.GGUFWriter(path=None, arch=arch)  # writes general.architecture first
    for name, data in convert_tensors(cfg, weights, arch):
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32), raw_dtype=gguf.GGMLQuantizationType.F32)

    # general.*: type, then name/size label from gguf's model-card heuristics (the directory name,
    # capitalised: "Llama", "Qwen3_Moe", ...), exactly as the converter fills them.
    w.add_type(gguf.GGUFType.MODEL)
    total, shared, expert, n_exp = w.get_total_parameter_count()
    meta = gguf.Metadata.load(None, src, None, total)
    if meta.name is None:
        meta.name = src.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_exp)
    meta.set_gguf_meta_model(w)

    add_hparams(w, cfg, arch, hf_arch)
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    add_vocab(w, src, cfg)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".gguf.part")
    w.write_header_to_file(path=tmp)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out_path)
    return hashlib.sha256(out_path.read_bytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC, help=f"fixture root (default {DEFAULT_SRC})")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    ap.add_argument("names", nargs="*", default=NAMES, help="fixture directories (default: all seven)")
    args = ap.parse_args()
    for name in args.names:
        digest = convert(args.src / name, args.out / f"{name}.gguf")
        print(f"{digest}  {name}.gguf")


if __name__ == "__main__":
    sys.exit(main())
