#!/usr/bin/env python3
"""make-lora-fixtures.py - PEFT LoRA adapters for the seven tiny HF models + transformers/peft reference outputs.

Input (read only): ../shared/fixtures/tiny-models/<arch>/ (config.json, model.safetensors, reference.json),
                   and its make_fixtures.py (only for `numpy_forward`, the independent float64 cross-check).
Output:            daemon/tests/fixtures/lora-peft/<dir>/{adapter_config.json, adapter_model.safetensors,
                   reference.json} for dir in llama mistral qwen2 qwen3 qwen3_moe gemma3 phi3 llama-rslora
                   llama-layers. (PEFT's auto-generated README.md model card is deleted; the hand-written
                   daemon/tests/fixtures/lora-peft/README.md describes everything.)

How to run (CPU only, about 15 s on 2 cores, no network once the packages are installed). PyPI's
torch 2.15.0 wheel is the CUDA build (it pulls in the nvidia-* packages); it runs on CPU:
    python3 -m venv /tmp/lora-venv
    /tmp/lora-venv/bin/pip install torch==2.15.0 transformers==5.24.0 peft==0.21.2 tokenizers==0.23.3 \\
        safetensors==0.8.0 numpy==2.4.6 accelerate==1.16.0 huggingface_hub==2.4.0
    HF_HUB_OFFLINE=1 /tmp/lora-venv/bin/python scripts/make-lora-fixtures.py [--src DIR] [--out DIR]
With these versions (python 3.11.7) the output is byte-identical from run to run.

What it does, per fixture:
  1. load the base model from disk (float32, eager attention, eager experts for MoE);
  2. get_peft_model(LoraConfig(r=8, lora_alpha=16, lora_dropout=0, target_modules=..., task_type=CAUSAL_LM));
  3. overwrite every lora_A / lora_B weight (in named_parameters() order) with STD * N(0,1) drawn from
     torch.Generator().manual_seed(seed) - PEFT would init B to zero, which makes the adapter a no-op;
  4. PeftModel.save_pretrained(dir) -> adapter_config.json + adapter_model.safetensors;
  5. reload: a fresh base model + PeftModel.from_pretrained(dir), and record logits and greedy tokens from
     the PeftModel (not merged weights) for the same inputs as the base reference.json;
  6. checks: generate() == a no-cache argmax loop; PeftModel vs merge_and_unload() logits; an independent
     numpy float64 forward pass (the base fixtures' numpy_forward) on weights merged by hand as
     W + scale * B @ A from the two files on disk must match every recorded logit.
"""
import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    # PEFT stores target_modules as a set and writes it as a list in set order: fix the string hash seed
    # so adapter_config.json is byte-identical from run to run.
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import importlib.util
import json
import math
import platform
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import peft
import safetensors
import tokenizers
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM, GenerationConfig

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SRC = ROOT.parent / "shared" / "fixtures" / "tiny-models"
DEFAULT_OUT = ROOT / "daemon" / "tests" / "fixtures" / "lora-peft"

R = 8
ALPHA = 16
DENSE = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PHI3 = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]  # fused in Phi-3
ATTN_ONLY = ["q_proj", "k_proj", "v_proj", "o_proj"]  # qwen3_moe: experts are fused 3-D parameters in transformers 5

# Random LoRA weights: A = STD_A * N(0,1), B = STD_B * N(0,1). With scale alpha/r = 2 the effective update
# scale * B @ A has entries of std 2 * 0.1 * 0.1 * sqrt(8) = 0.057, against base weights of std 0.2.
# rsLoRA's scale alpha/sqrt(r) = 5.657 is 2.83x larger, so its B std is 0.035 (~0.1/2.83) for about the same effect.
STD_A = 0.1
STD_B = 0.1
# (out dir, base arch, target_modules, seed, extra LoraConfig kwargs, std_b). Seed: the first of
# base, base+1000, base+2000, ... (base = 101..107, 201, 202) whose greedy run has every top1-top2 logit
# margin >= 0.01, so float32 noise (~1e-5) cannot flip a greedy token (qwen3_moe: also the gap between the
# 2nd and 3rd router logit >= 0.01 on every token, so expert selection cannot flip either).
FIXTURES = [
    ("llama", "llama", DENSE, 2101, {}, STD_B),
    ("mistral", "mistral", DENSE, 102, {}, STD_B),
    ("qwen2", "qwen2", DENSE, 103, {}, STD_B),
    ("qwen3", "qwen3", DENSE, 1104, {}, STD_B),
    ("qwen3_moe", "qwen3_moe", ATTN_ONLY, 2105, {}, STD_B),
    ("gemma3", "gemma3", DENSE, 1106, {}, STD_B),
    ("phi3", "phi3", PHI3, 107, {}, STD_B),
    ("llama-rslora", "llama", DENSE, 201, {"use_rslora": True}, 0.035),
    ("llama-layers", "llama", DENSE, 202, {"layers_to_transform": [1]}, STD_B),
]


def load_base_script(src):
    spec = importlib.util.spec_from_file_location("tiny_make_fixtures", Path(src) / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def f32(x):
    """float32 value -> shortest decimal that round-trips to the same float32 (as the base fixtures)."""
    return float(str(np.float32(x)))


def f32list(t):
    return [f32(v) for v in t.detach().to(torch.float32).cpu().numpy().reshape(-1)]


def dump_json(obj, path):
    s = json.dumps(obj, indent=2, ensure_ascii=False)
    s = re.sub(r"\[\s+([-+0-9eE.,\s]+?)\s+\]", lambda m: "[" + re.sub(r"\s+", "", m.group(1)) + "]", s)
    Path(path).write_text(s + "\n", encoding="utf-8")


def versions():
    return {
        "python": platform.python_version(),
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }


def load_base(d, dtype=torch.float32):
    kw = {"attn_implementation": "eager"}
    if json.loads((Path(d) / "config.json").read_text())["model_type"] == "qwen3_moe":
        kw["experts_implementation"] = "eager"
    return AutoModelForCausalLM.from_pretrained(d, dtype=dtype, **kw).eval()


@torch.no_grad()
def logits_of(model, ids):
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


@torch.no_grad()
def greedy_manual(model, ids, n):
    seq, margins, tops = list(ids), [], []
    for _ in range(n):
        last = logits_of(model, seq)[-1]
        top = torch.topk(last, 5)
        margins.append(f32(top.values[0] - top.values[1]))
        tops.append({"ids": [int(i) for i in top.indices], "logits": f32list(top.values)})
        seq.append(int(top.indices[0]))
    return seq[len(ids):], margins, tops


def merged_numpy_dir(base_dir, adapter_dir, tmp):
    """Merge by hand, from the files only: W' = W + scale * B @ A (fan_in_fan_out false)."""
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / (math.sqrt(cfg["r"]) if cfg["use_rslora"] else cfg["r"])
    w = load_file(str(base_dir / "model.safetensors"))
    ad = load_file(str(adapter_dir / "adapter_model.safetensors"))
    pre = "base_model.model."
    n = 0
    for k in ad:
        assert k.startswith(pre) and (k.endswith(".lora_A.weight") or k.endswith(".lora_B.weight")), k
        if not k.endswith(".lora_A.weight"):
            continue
        mod = k[len(pre):-len(".lora_A.weight")]
        a = ad[k].astype(np.float64)
        b = ad[pre + mod + ".lora_B.weight"].astype(np.float64)
        w[mod + ".weight"] = (w[mod + ".weight"].astype(np.float64) + scale * (b @ a)).astype(np.float32)
        n += 1
    assert 2 * n == len(ad)
    out = Path(tmp)
    shutil.copy(base_dir / "config.json", out / "config.json")
    save_file(w, str(out / "model.safetensors"))
    return out


def make_one(name, arch, targets, seed, extra, std_b, src, out_root, base_script):
    base_dir = src / arch
    base_ref = json.loads((base_dir / "reference.json").read_text())
    d = out_root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)

    # ---- build and save the adapter
    torch.manual_seed(seed)
    model = load_base(base_dir)
    model.__dict__["name_or_path"] = f"../shared/fixtures/tiny-models/{arch}"  # recorded in adapter_config.json
    lcfg = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=list(targets), bias="none",
                      task_type="CAUSAL_LM", **extra)
    pm = get_peft_model(model, lcfg)
    g = torch.Generator().manual_seed(seed)
    n_lora = 0
    with torch.no_grad():
        for pname, p in pm.named_parameters():
            if ".lora_A." in pname:
                p.copy_(STD_A * torch.randn(p.shape, generator=g, dtype=torch.float32))
                n_lora += 1
            elif ".lora_B." in pname:
                p.copy_(std_b * torch.randn(p.shape, generator=g, dtype=torch.float32))
                n_lora += 1
    assert n_lora > 0
    pm.save_pretrained(d)
    card = d / "README.md"  # PEFT's boilerplate model card
    if card.exists():
        card.unlink()
    assert sorted(p.name for p in d.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"], \
        list(d.iterdir())
    sd_mem = {k: v for k, v in pm.state_dict().items() if "lora_" in k}
    del pm, model

    # ---- everything below uses only what is on disk
    ad = load_file(str(d / "adapter_model.safetensors"))
    assert len(ad) == len(sd_mem) == n_lora
    for k, v in sd_mem.items():  # adapter name "default" is stripped on save
        assert np.array_equal(ad[k.replace(".default.", ".")], v.numpy()), k
    acfg = json.loads((d / "adapter_config.json").read_text())

    peft_model = PeftModel.from_pretrained(load_base(base_dir), d).eval()
    base_model = load_base(base_dir)

    ref = {
        "base": arch,
        "base_dir": f"../shared/fixtures/tiny-models/{arch}",
        "architecture": base_ref["architecture"],
        "dtype": "float32",
        "attn_implementation": "eager",
        **({"experts_implementation": "eager"} if arch == "qwen3_moe" else {}),
        "note": "logits from the transformers+peft PeftModel forward() on CPU, float32 (adapter applied "
                "unmerged); lists are float32 values (shortest decimal that round-trips to float32)",
        "versions": versions(),
        "init": {"seed": seed, "lora_A_std": f32(STD_A), "lora_B_std": f32(std_b),
                 "method": "torch.Generator().manual_seed(seed); for each lora_A/lora_B weight in "
                           "named_parameters() order: std * randn(shape, generator)"},
        "peft_config": {
            "r": acfg["r"], "lora_alpha": acfg["lora_alpha"], "use_rslora": acfg["use_rslora"],
            "target_modules": sorted(acfg["target_modules"]), "layers_to_transform": acfg["layers_to_transform"],
            "fan_in_fan_out": acfg["fan_in_fan_out"],
            "scale": f32(acfg["lora_alpha"] / (math.sqrt(acfg["r"]) if acfg["use_rslora"] else acfg["r"])),
        },
        "sequences": [],
    }
    all_ids = []
    max_abs, max_move = 0.0, 0.0
    for bs in base_ref["sequences"]:
        ids = bs["input_ids"]
        all_ids.append(ids)
        lg = logits_of(peft_model, ids)
        ent = {"name": bs["name"], "input_ids": ids, "last_logits": f32list(lg[-1])}
        if "all_logits" in bs:
            ent["all_logits"] = [f32list(row) for row in lg]
        ref["sequences"].append(ent)
        max_abs = max(max_abs, float(lg.abs().max()))
        base_lg = torch.tensor(bs["all_logits"] if "all_logits" in bs else [bs["last_logits"]])
        max_move = max(max_move, float((lg[-base_lg.shape[0]:] - base_lg).abs().max()))

    bg = base_ref["greedy"]
    prompt, n_new = bg["input_ids"], bg["max_new_tokens"]
    manual_ids, margins, tops = greedy_manual(peft_model, prompt, n_new)
    gen_cfg = GenerationConfig(max_new_tokens=n_new, min_new_tokens=0, do_sample=False, num_beams=1,
                               eos_token_id=None, pad_token_id=base_model.config.pad_token_id, bos_token_id=None)
    peft_model.base_model.model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = peft_model.generate(input_ids=torch.tensor([prompt]), generation_config=gen_cfg,
                                  attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    gen_ids = out[0, len(prompt):].tolist()
    assert gen_ids == manual_ids, (name, gen_ids, manual_ids)
    n_diff = sum(a != b for a, b in zip(gen_ids, bg["new_token_ids"]))
    ref["greedy"] = {
        "input_ids": prompt,
        "max_new_tokens": n_new,
        "stop_at_eos": False,
        "new_token_ids": gen_ids,
        "top1_minus_top2_logit_per_step": margins,
        "top5_per_step": tops,
        "base_new_token_ids": bg["new_token_ids"],
        "positions_differing_from_base": n_diff,
        "note": "PeftModel.generate(do_sample=False, eos_token_id=None) with KV cache; identical to a "
                "no-cache full-recompute argmax loop. top5_per_step[i] = the 5 largest logits (and ids) at "
                "decode step i (from the no-cache loop).",
    }
    all_ids.append(prompt + gen_ids)

    # ---- sanity figures
    merged = PeftModel.from_pretrained(load_base(base_dir), d).merge_and_unload().eval()
    d_merge = max(float((logits_of(merged, i) - logits_of(peft_model, i)).abs().max()) for i in all_ids)
    base_max = max(float(logits_of(base_model, i).abs().max()) for i in all_ids)
    with tempfile.TemporaryDirectory() as tmp:
        md = merged_numpy_dir(base_dir, d, tmp)
        d_np = 0.0
        for s in ref["sequences"]:
            lg = base_script.numpy_forward(md, s["input_ids"])
            d_np = max(d_np, float(np.abs(lg[-1] - np.array(s["last_logits"])).max()))
            if "all_logits" in s:
                d_np = max(d_np, float(np.abs(lg - np.array(s["all_logits"])).max()))
        lg = base_script.numpy_forward(md, prompt + gen_ids)
        for step, top in enumerate(tops):
            row = lg[len(prompt) - 1 + step]
            assert int(np.argmax(row)) == gen_ids[step], (name, step)
            d_np = max(d_np, float(np.abs(row[top["ids"]] - np.array(top["logits"])).max()))
    assert d_np < 1e-4, (name, d_np)
    assert math.isfinite(max_abs) and max_abs < 4 * base_ref["numerics"]["max_abs_logit"], (name, max_abs)
    assert max_move > 1e-3 * max_abs, (name, max_move)
    ref["numerics"] = {
        "max_abs_logit": f32(max_abs),
        "base_max_abs_logit": base_ref["numerics"]["max_abs_logit"],
        "max_abs_logit_diff_vs_base": f32(max_move),
        "min_top1_top2_margin_in_greedy": min(margins),
        "max_abs_diff_peft_vs_merged": f32(d_merge),
        "max_abs_diff_vs_numpy_fp64_merged": f32(d_np),
        "note": "max_abs_logit and max_abs_logit_diff_vs_base: over the sequences (vs the base reference.json "
                "logits); peft_vs_merged: PeftModel vs merge_and_unload() in float32, over the sequences and "
                "the greedy prompt+continuation; numpy_fp64_merged: an independent float64 numpy forward on "
                "W + scale * B @ A merged from the files, vs every logit recorded here.",
    }
    if arch == "qwen3_moe":  # expert choice must not hinge on float32 noise either
        ref["numerics"]["min_router_kth_minus_k1th_logit"] = base_script.router_min_margin(peft_model, all_ids)
    dump_json(ref, d / "reference.json")
    for p in d.iterdir():
        p.chmod(0o644)
    sizes = {p.name: p.stat().st_size for p in sorted(d.iterdir())}
    layer0 = [f"{k} {list(v.shape)} {v.dtype}" for k, v in sorted(ad.items()) if ".layers.0." in k]
    layer1 = [k for k in ad if ".layers.1." in k]
    return {"name": name, "seed": seed, "files": sizes, "adapter_config_keys": sorted(acfg),
            "n_tensors": len(ad), "n_layer1_tensors": len(layer1), "layer0": layer0,
            "greedy": gen_ids, "base_greedy": bg["new_token_ids"], "positions_differing": n_diff,
            "numerics": {k: v for k, v in ref["numerics"].items() if k != "note"},
            "base_max_abs_logit_incl_greedy": f32(base_max)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    base_script = load_base_script(args.src)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, arch, targets, seed, extra, std_b in FIXTURES:
        if args.names and name not in args.names:
            continue
        info = make_one(name, arch, targets, seed, extra, std_b, args.src, args.out, base_script)
        print(json.dumps(info))
    print("versions:", json.dumps(versions()))


if __name__ == "__main__":
    main()
