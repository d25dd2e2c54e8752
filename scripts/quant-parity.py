#!/usr/bin/env python3
"""Helper of scripts/quant-parity.sh (python standard library only). Not meant to be run by hand,
but each subcommand is self-contained:

  quant-parity.py gguf-info FILE
      prints, as JSON, general.file_type, the tensor count and the per-type tensor counts read from
      the GGUF header's tensor-info table (and a per-role breakdown: blk.N.attn_q -> blk.*.attn_q).
  quant-parity.py files --bin BIN --src GGUF --dir DIR --manifest JSON [--update-manifest] TYPE...
      makes DIR/<stem>.<TYPE>.gguf with `BIN/llama-quantize --allow-requantize SRC OUT TYPE 2`
      (OUT.part, then rename) and checks each file's SHA-256 and size against the manifest;
      --update-manifest writes the manifest from what was produced instead of checking.
  quant-parity.py wait-health URL SECONDS
      polls URL/health until it answers 200 (exit 1 on timeout).
  quant-parity.py refs-one --url URL --model GGUF --label LABEL --family smollm2|gemma3|own --out JSON
                           --bin BIN --build-info FILE --server-cmd CMD
      runs the fixed prompt set against a llama-server already listening at URL and writes JSON.
  quant-parity.py check-prompts JSON...
      checks that the files agree on every prompt's prompt_token_ids (same tokenizer metadata).

The GGUF reader follows the GGUF v3 layout: magic "GGUF", u32 version, u64 tensor count, u64 kv
count, the kv pairs (u64-length strings, u32 value type, typed value; arrays are u32 element type +
u64 count + elements), then per tensor: name, u32 n_dims, u64 ne[n_dims] (fastest dimension first),
u32 ggml type, u64 data offset.
"""
import argparse
import hashlib
import json
import math
import os
import re
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOLLM_REF = os.path.join(ROOT, "..", "shared", "fixtures", "llamacpp", "reference.json")
GEMMA_REF = os.path.join(ROOT, "..", "shared", "fixtures", "llamacpp-gemma3", "reference.json")

# ggml/include/ggml.h enum ggml_type (this llama.cpp, b11312)
GGML_TYPES = {
    0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 9: "q8_1",
    10: "q2_K", 11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K", 15: "q8_K", 16: "iq2_xxs",
    17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s", 20: "iq4_nl", 21: "iq3_s", 22: "iq2_s", 23: "iq4_xs",
    24: "i8", 25: "i16", 26: "i32", 27: "i64", 28: "f64", 29: "iq1_m", 30: "bf16", 34: "tq1_0",
    35: "tq2_0", 39: "mxfp4", 40: "nvfp4", 41: "q1_0", 42: "q2_0",
}
# include/llama.h enum llama_ftype (the subset we make)
LLAMA_FTYPES = {0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0",
                8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 15: "MOSTLY_Q4_K_M",
                17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K", 32: "MOSTLY_BF16"}

# ---------------------------------------------------------------------------------------------- GGUF

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
           12: "<d"}


class _Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt):
        n = struct.calcsize(fmt)
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError("truncated GGUF header")
        return struct.unpack(fmt, b)[0]

    def string(self):
        n = self.take("<Q")
        return self.f.read(n).decode("utf-8", errors="replace")

    def value(self, vtype, keep=True):
        if vtype in _SCALAR:
            return self.take(_SCALAR[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype = self.take("<I")
            n = self.take("<Q")
            if etype in _SCALAR and not keep:
                self.f.seek(n * struct.calcsize(_SCALAR[etype]), 1)
                return None
            vals = [self.value(etype, keep) for _ in range(n)]
            return vals if keep else None
        raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_info(path):
    """general.file_type, tensor count and per-type counts from the GGUF header."""
    with open(path, "rb") as f:
        r = _Reader(f)
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = r.take("<I")
        n_tensors = r.take("<Q")
        n_kv = r.take("<Q")
        kv = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.take("<I")
            # big arrays (the vocabulary) are skipped, everything else is kept
            val = r.value(vtype, keep=not key.startswith("tokenizer.ggml."))
            kv[key] = val
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            nd = r.take("<I")
            ne = [r.take("<Q") for _ in range(nd)]
            ttype = r.take("<I")
            r.take("<Q")  # offset
            tensors.append((name, ne, GGML_TYPES.get(ttype, f"type{ttype}")))
    counts = {}
    roles = {}
    for name, ne, t in tensors:
        counts[t] = counts.get(t, 0) + 1
        role = re.sub(r"^blk\.\d+\.", "blk.*.", name)
        ent = roles.setdefault(role, {"ne": ne, "count": 0, "types": {}})
        ent["count"] += 1
        ent["types"][t] = ent["types"].get(t, 0) + 1
    ft = kv.get("general.file_type")
    return {
        "gguf_version": version,
        "general.file_type": ft,
        "file_type_name": LLAMA_FTYPES.get(ft, str(ft)) if ft is not None else None,
        "general.quantization_version": kv.get("general.quantization_version"),
        "tensor_count": n_tensors,
        "tensor_types": dict(sorted(counts.items(), key=lambda kv_: (-kv_[1], kv_[0]))),
        "tensor_types_by_role": roles,
    }


def dumps(obj, level=0):
    """JSON with one item per line, except lists/dicts of scalars, which stay on one line."""
    pad, pad1 = " " * level, " " * (level + 1)
    scalar = lambda v: not isinstance(v, (list, dict))  # noqa: E731
    if isinstance(obj, list):
        if all(scalar(v) for v in obj):
            return json.dumps(obj, ensure_ascii=False)
        return "[\n" + ",\n".join(pad1 + dumps(v, level + 1) for v in obj) + "\n" + pad + "]"
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        if all(scalar(v) for v in obj.values()) and len(obj) <= 6:
            return json.dumps(obj, ensure_ascii=False)
        return "{\n" + ",\n".join(pad1 + json.dumps(k, ensure_ascii=False) + ": " + dumps(v, level + 1)
                                  for k, v in obj.items()) + "\n" + pad + "}"
    return json.dumps(obj, ensure_ascii=False)


def write_json(path, obj):
    """Atomically: path.part, then rename."""
    with open(path + ".part", "w") as f:
        f.write(dumps(obj) + "\n")
    os.replace(path + ".part", path)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- files

def cmd_files(a):
    stem = os.path.basename(a.src)
    stem = stem[: -len(".gguf")] if stem.endswith(".gguf") else stem
    stem = re.sub(r"\.Q4_1$", "", stem)  # SmolLM2-135M-Instruct.Q4_1 -> SmolLM2-135M-Instruct
    quantize = os.path.join(a.bin, "llama-quantize")
    os.makedirs(a.dir, exist_ok=True)
    manifest = None
    if os.path.exists(a.manifest):
        with open(a.manifest) as f:
            manifest = json.load(f)
    elif not a.update_manifest:
        sys.exit(f"quant-parity: no manifest at {a.manifest}; run `scripts/quant-parity.sh files "
                 f"--update-manifest` to create it")
    expected = (manifest or {}).get("files", {})
    produced = {}
    failures = []
    t_all = time.time()
    for qtype in a.types:
        name = f"{stem}.{qtype}.gguf"
        out = os.path.join(a.dir, name)
        want = expected.get(qtype)
        if os.path.exists(out) and want and os.path.getsize(out) == want["size"] \
                and sha256_of(out) == want["sha256"]:
            print(f"quant-parity: {name} present (sha256 ok)", file=sys.stderr)
            produced[qtype] = (out, want["sha256"], want["size"], 0.0)
            continue
        part = out + ".part"
        cmd = [quantize, "--allow-requantize", a.src, part, qtype, str(a.threads)]
        t0 = time.time()
        log = out + ".log"
        with open(log, "w") as lf:
            rc = subprocess.call(cmd, stdout=lf, stderr=subprocess.STDOUT)
        dt = time.time() - t0
        if rc != 0:
            with open(log) as lf:
                tail = lf.read()[-3000:]
            if os.path.exists(part):
                os.remove(part)
            sys.exit(f"quant-parity: llama-quantize failed for {qtype} (rc {rc}); log {log}:\n{tail}")
        digest, size = sha256_of(part), os.path.getsize(part)
        if want and not a.update_manifest and (digest != want["sha256"] or size != want["size"]):
            failures.append(f"{qtype}: produced sha256 {digest} ({size} bytes) but the manifest says "
                            f"{want['sha256']} ({want['size']} bytes)")
            os.replace(part, out + ".mismatch")
            continue
        if not want and not a.update_manifest:
            os.remove(part)
            failures.append(f"{qtype}: not in the manifest (run with --update-manifest)")
            continue
        os.replace(part, out)
        print(f"quant-parity: {name} made in {dt:.1f}s ({size} bytes)", file=sys.stderr)
        produced[qtype] = (out, digest, size, dt)
    if failures:
        sys.exit("quant-parity: the quantized files differ from "
                 f"{a.manifest} - this llama-quantize was built differently (or "
                 "from another llama.cpp) than the one that wrote the manifest, so the committed "
                 "references may not describe these files:\n  " + "\n  ".join(failures) +
                 "\n(the differing outputs are kept as *.gguf.mismatch; `scripts/quant-parity.sh files "
                 "--update-manifest` followed by `scripts/quant-parity.sh refs` regenerates everything)")
    if a.update_manifest:
        write_manifest(a, stem, produced)
    print(f"quant-parity: {len(produced)} files in {a.dir} ({time.time() - t_all:.1f}s)", file=sys.stderr)


def write_manifest(a, stem, produced):
    build_info = read_text(a.build_info)
    src_info = gguf_info(a.src)
    files = {}
    for qtype in a.types:
        out, digest, size, _ = produced[qtype]
        info = gguf_info(out)
        files[qtype] = {
            "file": os.path.basename(out),
            "sha256": digest,
            "size": size,
            "general.file_type": info["general.file_type"],
            "file_type_name": info["file_type_name"],
            "tensor_count": info["tensor_count"],
            "tensor_types": info["tensor_types"],
            "fallbacks": quantize_fallbacks(out + ".log"),
            "tensor_types_by_role": info["tensor_types_by_role"],
        }
    manifest = {
        "about": "Quantized variants of the default model made by `scripts/quant-parity.sh files` into "
                 "${INFERD_QUANT_DIR:-$HOME/.cache/inferd/quant-files}; their llama.cpp references are "
                 "the <TYPE>.json files beside this manifest.",
        "command": "llama-quantize --allow-requantize " + os.path.basename(a.src) +
                   " " + stem + ".<TYPE>.gguf <TYPE> " + str(a.threads),
        "requantized_note": "The source is itself Q4_1 (with a q8_0 token_embd): llama-quantize "
                            "dequantizes it to f32 and quantizes again, so every file carries the Q4_1 "
                            "error plus its own; F16 and Q8_0 are (close to) lossless copies of the "
                            "Q4_1 weights, not of the original bf16 model.",
        "fallback_note": "k-quants (q4_K, q5_K, q6_K) store 256-value super-blocks along a row, and "
                         "576 (n_embd) is not a multiple of 256: every k-quant tensor whose row length "
                         "ne[0] is 576 (attn_q/k/v/output, ffn_gate, ffn_up, token_embd) falls back in "
                         "llama-quant.cpp tensor_type_fallback(): q4_K -> q5_0, q5_K -> q5_1, "
                         "q6_K -> q8_0 ('fallbacks' counts them from llama-quantize's log). Only "
                         "ffn_down (ne[0] = n_ff = 1536 = 6*256) is a k-quant in the *_K* files. "
                         "token_embd is also the output head (tied): it is q8_0 in every file but F16 "
                         "(for Q4_0/Q5_1 it wanted the output type q6_K and fell back). 1-D tensors "
                         "(norms) stay f32. tensor_types_by_role gives ne (fastest dimension first) "
                         "and the types per tensor role.",
        "llama_cpp_build_info": build_info.strip().splitlines(),
        "source": {
            "file": os.path.basename(a.src),
            "sha256": sha256_of(a.src),
            "size": os.path.getsize(a.src),
            "tensor_types": src_info["tensor_types"],
        },
        "files": files,
    }
    write_json(a.manifest, manifest)
    print(f"quant-parity: wrote {a.manifest}", file=sys.stderr)


def quantize_fallbacks(log):
    """'<wanted> -> <used>': count, from llama-quantize's 'falling back' warnings (its log)."""
    text = read_text(log)
    if not text:
        return None
    out = {}
    for m in re.finditer(r"required for type\s+(\S+)\).*?falling back to\s+(\S+)", text):
        key = f"{m.group(1)} -> {m.group(2)}"
        out[key] = out.get(key, 0) + 1
    m = re.search(r"WARNING: (\d+) of (\d+) tensor\(s\) required fallback", text)
    out["total"] = int(m.group(1)) if m else sum(out.values())
    return out


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------- HTTP

def post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def cmd_wait_health(a):
    deadline = time.time() + float(a.seconds)
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(a.url.rstrip("/") + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    sys.exit(f"quant-parity: {a.url}/health did not answer 200 within {a.seconds}s")


# ---------------------------------------------------------------------------------------------- refs

N_PREDICT = 32
N_PROBS = 2
REQUEST = {
    "n_predict": N_PREDICT,
    "temperature": 0.0,
    "top_k": 1,
    "top_p": 1.0,
    "min_p": 0.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "seed": 0,
    "cache_prompt": False,
    "return_tokens": True,
    "ignore_eos": False,
    "n_probs": N_PROBS,
    "post_sampling_probs": False,
}

# Our own chat prompts (rendered by the server's /apply-template, tokenized by its /tokenize).
OWN_CHATS = [
    ("own-haiku", [{"role": "user", "content": "Write a haiku about the sea."}]),
    ("own-math", [{"role": "system", "content": "You are a patient math tutor."},
                  {"role": "user", "content": "What is 17 times 23? Explain step by step."}]),
    ("own-multiturn", [{"role": "user", "content": "Hi! What's your name?"},
                       {"role": "assistant", "content": "I'm SmolLM, a small language model."},
                       {"role": "user", "content": "Translate 'good morning' into Spanish and German."}]),
    ("own-unicode-code", [{"role": "user", "content":
                           "Écris une fonction Python qui renvoie « naïve café » à l'envers ☕ (reverse it)."}]),
]

# Raw prompts of the `own` family (models without fixture token ids).
OWN_RAW = [
    ("raw-code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("raw-prose", "The three primary colors are"),
]

PROBS_DOC = (
    "Request: n_probs 2, post_sampling_probs false (the default). In this llama.cpp "
    "(tools/server/server-context.cpp populate_token_probs, post_sampling=false -> "
    "tools/server/server-common.cpp get_token_probabilities) the server takes the raw logits of the "
    "position (llama_get_logits_ith, before any sampler: no temperature, top-k, penalties or logit "
    "bias), partially sorts the top n_probs by logit, and computes p = exp(l - l_max) / "
    "sum_over_ALL_vocab exp(l - l_max) in float32, i.e. the full-vocabulary softmax of the raw logits "
    "at temperature 1. The sampled token's prob is looked up in that same list. The JSON reports "
    "log(p) as 'logprob' and 'top_logprobs' (server-task.cpp completion_token_output::to_json; p == 0 "
    "would be written as -FLT_MAX). Pre-sampling logits also turn off backend sampling for the "
    "request (need_pre_sample_logits). With post_sampling_probs true it would instead report 'prob' / "
    "'top_probs' taken from the sampler chain's candidates after top_k=1 etc. - p = 1.0 for the one "
    "survivor, useless here. This file stores p = exp(logprob) (double, 8 significant digits).")

READING_DOC = (
    "Teacher-forced reference: llama.cpp's greedy output is the reference sequence. Feed "
    "prompt_token_ids + generated_token_ids; the distribution predicting generated_token_ids[i] is the "
    "one after prompt_token_ids + generated_token_ids[:i]; positions[i] = [top1_id, top1_p, top2_id, "
    "top2_p] of llama.cpp's softmax of the raw logits there (top1_id == generated_token_ids[i], "
    "checked). Compare your top-1 and its probability at every position; where top1_p - top2_p is "
    "small a flip is a near tie, not necessarily a bug. When stop_type is 'eos' the last generated id "
    "is the end-of-generation token (its position is included); 'limit' means n_predict was reached.")


def cpu_model():
    info = read_text("/proc/cpuinfo")
    fields = {}
    for line in info.splitlines():
        if ":" in line:
            k, v = (s.strip() for s in line.split(":", 1))
            fields.setdefault(k, v)
    flags = fields.get("flags", "").split()
    simd = [f for f in flags if f.startswith(("avx", "fma", "f16c", "amx", "sse4"))]
    return {
        "model_name": fields.get("model name"),
        "vendor": fields.get("vendor_id"),
        "family_model_stepping": f"{fields.get('cpu family')}/{fields.get('model')}/{fields.get('stepping')}",
        "logical_cpus": os.cpu_count(),
        "simd_flags": sorted(simd),
    }


def probs_of(resp):
    """positions from /completion's completion_probabilities (post_sampling_probs false)."""
    out = []
    for i, ent in enumerate(resp["completion_probabilities"]):
        top = ent["top_logprobs"]
        if len(top) < 2:
            raise RuntimeError(f"position {i}: fewer than 2 top_logprobs: {ent}")
        if top[0]["id"] != ent["id"]:
            raise RuntimeError(f"position {i}: sampled id {ent['id']} is not the raw-logit top-1 "
                               f"{top[0]['id']} - greedy sampling disagrees with the reported probs")
        sig = lambda lp: float("%.8g" % math.exp(lp))  # noqa: E731
        out.append([top[0]["id"], sig(top[0]["logprob"]), top[1]["id"], sig(top[1]["logprob"])])
    return out


def run_prompt(url, ids):
    body = dict(REQUEST, prompt=ids)
    r = post(url + "/completion", body)
    gen = r.get("tokens")
    if gen is None:
        raise RuntimeError("no 'tokens' in /completion response (return_tokens ignored?)")
    if r.get("tokens_evaluated") not in (None, len(ids)):
        raise RuntimeError(f"tokens_evaluated {r.get('tokens_evaluated')} != {len(ids)} prompt ids")
    pos = probs_of(r)
    if [p[0] for p in pos] != gen:
        raise RuntimeError("generated ids and per-position top-1 ids differ")
    return gen, r.get("stop_type"), r.get("content"), pos


def build_prompts(url, family):
    """The fixed prompt set: fixture prompts (ids as recorded) then our own chats (via the server)."""
    prompts = []
    if family == "smollm2":
        with open(SMOLLM_REF) as f:
            ref = json.load(f)
        for c in ref["chat"]:
            prompts.append({"id": "chat-" + c["id"], "kind": "chat",
                            "source": "shared/fixtures/llamacpp/reference.json chat id " + c["id"],
                            "messages": c["messages"], "prompt": c["prompt"],
                            "prompt_token_ids": c["prompt_token_ids"],
                            "fixture_generated_token_ids": c["generated_token_ids"]})
        rc = ref["raw_completion"]
        prompts.append({"id": "raw-once", "kind": "raw",
                        "source": "shared/fixtures/llamacpp/reference.json raw_completion",
                        "prompt": rc["prompt"], "prompt_token_ids": rc["prompt_token_ids"],
                        "fixture_generated_token_ids": rc["generated_token_ids"]})
    elif family == "own":
        # A model with a tokenizer of its own (no fixture ids): raw prompts tokenized by the
        # server, then the own chats below.
        for pid, text in OWN_RAW:
            ids = post(url + "/tokenize", {"content": text, "add_special": True,
                                           "parse_special": True})["tokens"]
            prompts.append({"id": pid, "kind": "raw", "source": "own (scripts/quant-parity.py OWN_RAW)",
                            "prompt": text, "prompt_token_ids": ids})
    else:
        with open(GEMMA_REF) as f:
            ref = json.load(f)
        for i, c in enumerate(ref["chat"]):
            prompts.append({"id": f"chat-{i}", "kind": "chat",
                            "source": f"shared/fixtures/llamacpp-gemma3/reference.json chat[{i}]",
                            "messages": c.get("messages"), "prompt": c.get("prompt"),
                            "prompt_token_ids": c["prompt_token_ids"],
                            "fixture_generated_token_ids": c.get("generated_token_ids")})
        for i, c in enumerate(ref["raw"]):
            prompts.append({"id": f"raw-{i}", "kind": "raw",
                            "source": f"shared/fixtures/llamacpp-gemma3/reference.json raw[{i}]",
                            "prompt": c["prompt"], "prompt_token_ids": c["prompt_token_ids"],
                            "fixture_generated_token_ids": c["generated_token_ids"]})
    # fixture chats: check the server renders and tokenizes them the same way (recorded)
    for p in prompts:
        if p["kind"] == "chat" and p.get("messages"):
            text = post(url + "/apply-template", {"messages": p["messages"]})["prompt"]
            ids = post(url + "/tokenize", {"content": text, "add_special": True,
                                           "parse_special": True})["tokens"]
            p["server_renders_same"] = text == p["prompt"] and ids == p["prompt_token_ids"]
    for pid, messages in OWN_CHATS:
        text = post(url + "/apply-template", {"messages": messages})["prompt"]
        ids = post(url + "/tokenize", {"content": text, "add_special": True,
                                       "parse_special": True})["tokens"]
        prompts.append({"id": pid, "kind": "chat", "source": "own (scripts/quant-parity.py OWN_CHATS)",
                        "messages": messages, "prompt": text, "prompt_token_ids": ids})
    return prompts


def cmd_refs_one(a):
    url = a.url.rstrip("/")
    t0 = time.time()
    props = {}
    try:
        with urllib.request.urlopen(url + "/props", timeout=30) as r:
            props = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        pass
    prompts = build_prompts(url, a.family)
    results = []
    for p in prompts:
        gen, stop, text, pos = run_prompt(url, p["prompt_token_ids"])
        ent = {k: v for k, v in p.items() if k != "fixture_generated_token_ids"}
        ent.update({
            "n_prompt_tokens": len(p["prompt_token_ids"]),
            "generated_token_ids": gen,
            "generated_text": text,
            "stop_type": stop,
            "positions": pos,
        })
        margins = [(q[1] - q[3], i) for i, q in enumerate(pos)]
        m, mi = min(margins)
        ent["min_top1_top2_margin"] = {"position": mi, "p1_minus_p2": float("%.6g" % m)}
        fx = p.get("fixture_generated_token_ids")
        if fx is not None:
            n = min(len(fx), len(gen))
            agree = next((i for i in range(n) if fx[i] != gen[i]), n)
            ent["fixture_prefix_agreement"] = {"matching_leading_tokens": agree, "of": len(gen),
                                               "note": "vs the fixture's generated ids (the fixture's "
                                                       "model file; meaningful for the same file only)"}
        results.append(ent)
    # determinism: the first prompt once more must give identical ids and probabilities
    gen2, _, _, pos2 = run_prompt(url, prompts[0]["prompt_token_ids"])
    repeat_ok = gen2 == results[0]["generated_token_ids"] and pos2 == results[0]["positions"]
    v = subprocess.run([os.path.join(a.bin, "llama-server"), "--version"], capture_output=True, text=True)
    version = (v.stderr + "\n" + v.stdout).strip().splitlines()
    info = gguf_info(a.model)
    doc = {
        "meta": {
            "engine": "llama.cpp llama-server, native build of vendor/llama.cpp from the llama-cpp-python "
                      "0.3.36 sdist (b11312, commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f; the sdist "
                      "has no .git so the binary reports its short hash only)",
            "llama_server_version": [v for v in version if v],
            "build_info": read_text(a.build_info).strip().splitlines(),
            "server_cmd": a.server_cmd,
            "label": a.label,
            "model_file": os.path.basename(a.model),
            "model_sha256": sha256_of(a.model),
            "model_size": os.path.getsize(a.model),
            "file_type_name": info["file_type_name"],
            "tensor_types": info["tensor_types"],
            "model_source": a.model_source,
            "cpu": cpu_model(),
            "threads": 2,
            "endpoints": {
                "templating": "POST /apply-template {messages} (GGUF tokenizer.chat_template, "
                              "add_generation_prompt true; llama.cpp's ChatML fallback when the GGUF "
                              "has none)",
                "tokenization": "POST /tokenize {content, add_special: true, parse_special: true} - "
                                "what /completion does with a string prompt (BOS only where the "
                                "model's add_bos is true)",
                "generation": "POST /completion with prompt = the token id list",
            },
            "request": REQUEST,
            "probabilities": PROBS_DOC,
            "reading": READING_DOC,
            "chat_template": (props.get("chat_template") or None),
            "repeat_identical": repeat_ok,
        },
        "prompts": results,
    }
    if a.family == "gemma3":
        doc["meta"]["chat_note"] = ("gemma-3-270m is a base model whose GGUF has no "
                                    "tokenizer.chat_template; the own-* chats use llama.cpp's ChatML "
                                    "fallback (as the fixture notes, the model was not trained on it). "
                                    "They are still valid teacher-forcing sequences.")
    if not repeat_ok:
        sys.exit("quant-parity: repeating a prompt gave different ids/probabilities - nondeterministic")
    write_json(a.out, doc)
    worst = min(results, key=lambda e: e["min_top1_top2_margin"]["p1_minus_p2"])
    print(f"quant-parity: wrote {os.path.relpath(a.out, ROOT)} ({len(results)} prompts, "
          f"{time.time() - t0:.1f}s; smallest top-1/top-2 margin {worst['min_top1_top2_margin']} in "
          f"{worst['id']})", file=sys.stderr)


def cmd_check_prompts(a):
    seen = {}
    bad = []
    for path in a.files:
        with open(path) as f:
            doc = json.load(f)
        for p in doc["prompts"]:
            prev = seen.setdefault(p["id"], (path, p["prompt_token_ids"]))
            if prev[1] != p["prompt_token_ids"]:
                bad.append(f"{p['id']}: {os.path.basename(path)} vs {os.path.basename(prev[0])}")
    if bad:
        sys.exit("quant-parity: prompt ids differ between files:\n  " + "\n  ".join(bad))
    print(f"quant-parity: prompt ids agree across {len(a.files)} files", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("gguf-info")
    s.add_argument("file")
    s = sub.add_parser("files")
    s.add_argument("--bin", required=True)
    s.add_argument("--src", required=True)
    s.add_argument("--dir", required=True)
    s.add_argument("--manifest", required=True)
    s.add_argument("--build-info", default="")
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--update-manifest", action="store_true")
    s.add_argument("types", nargs="+")
    s = sub.add_parser("wait-health")
    s.add_argument("url")
    s.add_argument("seconds")
    s = sub.add_parser("refs-one")
    for k in ("--url", "--model", "--label", "--out", "--bin", "--build-info", "--server-cmd",
              "--model-source"):
        s.add_argument(k, required=True)
    s.add_argument("--family", choices=("smollm2", "gemma3", "own"), required=True)
    s = sub.add_parser("check-prompts")
    s.add_argument("files", nargs="+")
    a = ap.parse_args()
    if a.cmd == "gguf-info":
        print(dumps(gguf_info(a.file)))
    elif a.cmd == "files":
        cmd_files(a)
    elif a.cmd == "wait-health":
        cmd_wait_health(a)
    elif a.cmd == "refs-one":
        cmd_refs_one(a)
    elif a.cmd == "check-prompts":
        cmd_check_prompts(a)


if __name__ == "__main__":
    main()
