#!/usr/bin/env python3
"""Helper of scripts/lora-gguf.sh (python standard library only; the adapters themselves are written
by scripts/make-lora-gguf.py in its own venv). The prompt set, the request, the JSON layout and the
llama-server plumbing are scripts/quant-parity.py's, imported from there unchanged.

  lora-gguf.py files --python PY --dir DIR --manifest JSON --smollm2 GGUF --gemma3 GGUF
                     [--update-manifest]
      makes DIR/<file> for every adapter in ADAPTERS below with `PY scripts/make-lora-gguf.py`
      (written as <file>.new, renamed after its SHA-256 and size matched the manifest; a mismatch
      is kept as <file>.mismatch and fails). A file already there with the manifest's SHA-256 and
      size is kept. The bases must match the manifest's base SHA-256 (the references were made
      with them). --update-manifest (re)writes the manifest from what was produced instead.
  lora-gguf.py spec NAME
      prints "file<TAB>base-key" of one adapter (for the shell script).
  lora-gguf.py refs-one --adapter FILE --scale S --manifest JSON [quant-parity.py refs-one args]
      quant-parity.py refs-one, then adds meta.adapter (file, sha256, size, rank, alpha, type,
      seed, scale, how llama.cpp applies it) to the JSON.
  lora-gguf.py scale0 --url URL --family F --base-ref JSON
      the prompt set once more against a llama-server that has the adapter loaded, each request
      with "lora": [{"id": 0, "scale": 0}], and compares ids and probabilities with the base
      model's reference JSON (exit 1 when they differ).
  lora-gguf.py same JSON OTHER_JSON
      whether two reference JSONs agree (generated ids; largest probability difference); exit 1 if not.
  lora-gguf.py compare JSON BASE_JSON...
      per prompt: generated tokens that differ from the base reference (position by position, a
      length difference counting as differing), the first differing position, and the smallest
      top1-top2 margin.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAKE = os.path.join(ROOT, "scripts", "make-lora-gguf.py")

_spec = importlib.util.spec_from_file_location("quant_parity", os.path.join(ROOT, "scripts", "quant-parity.py"))
qp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qp)

# name -> what make-lora-gguf.py is asked for. `base` names the base model (--smollm2 / --gemma3).
ADAPTERS = {
    "smollm2-f16": {"file": "smollm2-lora-f16.gguf", "base": "smollm2", "rank": 8, "alpha": 16,
                    "type": "f16", "seed": 1},
    "smollm2-q8_0": {"file": "smollm2-lora-q8_0.gguf", "base": "smollm2", "rank": 8, "alpha": 16,
                     "type": "q8_0", "seed": 2},
    "smollm2-f32-r4": {"file": "smollm2-lora-f32-r4.gguf", "base": "smollm2", "rank": 4, "alpha": 8,
                       "type": "f32", "seed": 3},
    "gemma3-f16": {"file": "gemma3-lora-f16.gguf", "base": "gemma3", "rank": 8, "alpha": 16,
                   "type": "f16", "seed": 4},
}
STRENGTH = 0.08  # make-lora-gguf.py --strength, the same for every adapter here

SCALE_DOC = (
    "llama.cpp (src/llama-graph.cpp build_lora_mm) computes, for every adapted projection W: "
    "y = W x + s * B (A x), with s = adapter_scale * alpha / rank (rank = lora_b ne[0]; alpha = "
    "adapter.lora.alpha; when alpha is 0 s = adapter_scale), added after the base matmul (and its "
    "w_s scale, before any bias). adapter_scale is the server's: --lora FILE gives 1.0, "
    "--lora-scaled FILE:S gives S (a per-request \"lora\": [{id, scale}] overrides it). lora_a has "
    "ne [n_in, rank], lora_b ne [rank, n_out]; both are dequantized/converted by ggml's mul_mat as "
    "usual (F16/BF16/Q8_0 A x is computed with x converted to the vec_dot type).")


def sha256_of(path):
    return qp.sha256_of(path)


def load_manifest(path, required=True):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    if required:
        sys.exit(f"lora-gguf: no manifest at {path}; run `scripts/lora-gguf.sh files --update-manifest`")
    return None


def make_cmd(py, base, out, spec):
    return [py, MAKE, "--base", base, "--out", out, "--rank", str(spec["rank"]),
            "--alpha", str(spec["alpha"]), "--type", spec["type"], "--seed", str(spec["seed"]),
            "--strength", str(STRENGTH), "--quiet"]


def cmd_files(a):
    bases = {"smollm2": a.smollm2, "gemma3": a.gemma3}
    manifest = load_manifest(a.manifest, required=not a.update_manifest)
    want_files = (manifest or {}).get("files", {})
    t_all = time.time()
    base_info = {}
    for key, path in bases.items():
        t0 = time.time()
        digest, size = sha256_of(path), os.path.getsize(path)
        base_info[key] = {"file": os.path.basename(path), "sha256": digest, "size": size}
        want = (manifest or {}).get("bases", {}).get(key)
        if want and not a.update_manifest and (want["sha256"] != digest or want["size"] != size):
            sys.exit(f"lora-gguf: base {path} has sha256 {digest} ({size} bytes), the manifest says "
                     f"{want['sha256']} ({want['size']} bytes): not the model the references were made with")
        print(f"lora-gguf: base {os.path.basename(path)} sha256 ok ({time.time() - t0:.1f}s)", file=sys.stderr)
    os.makedirs(a.dir, exist_ok=True)
    produced, failures = {}, []
    for name, spec in ADAPTERS.items():
        out = os.path.join(a.dir, spec["file"])
        want = want_files.get(name)
        if os.path.exists(out) and want and os.path.getsize(out) == want["size"] \
                and sha256_of(out) == want["sha256"]:
            print(f"lora-gguf: {spec['file']} present (sha256 ok)", file=sys.stderr)
            produced[name] = (want["sha256"], want["size"])
            continue
        new = out + ".new"
        t0 = time.time()
        rc = subprocess.call(make_cmd(a.python, bases[spec["base"]], new, spec))
        if rc != 0:
            sys.exit(f"lora-gguf: make-lora-gguf.py failed for {name} (rc {rc})")
        digest, size = sha256_of(new), os.path.getsize(new)
        if not a.update_manifest:
            if not want:
                os.remove(new)
                failures.append(f"{name}: not in the manifest (run with --update-manifest)")
                continue
            if digest != want["sha256"] or size != want["size"]:
                os.replace(new, out + ".mismatch")
                failures.append(f"{name}: produced sha256 {digest} ({size} bytes) but the manifest "
                                f"says {want['sha256']} ({want['size']} bytes)")
                continue
        os.replace(new, out)
        print(f"lora-gguf: {spec['file']} made in {time.time() - t0:.1f}s ({size} bytes)", file=sys.stderr)
        produced[name] = (digest, size)
    if failures:
        sys.exit("lora-gguf: the adapters differ from " + a.manifest + " (another gguf/numpy than the "
                 "pinned ones, or a changed generator?):\n  " + "\n  ".join(failures) +
                 "\n(the differing outputs are kept as *.gguf.mismatch; `scripts/lora-gguf.sh files "
                 "--update-manifest` followed by `scripts/lora-gguf.sh refs` regenerates everything)")
    if a.update_manifest:
        write_manifest(a, base_info, produced)
    print(f"lora-gguf: {len(produced)} adapters in {a.dir} ({time.time() - t_all:.1f}s)", file=sys.stderr)


def adapter_tensor_summary(path):
    info = qp.gguf_info(path)
    return info["tensor_count"], info["tensor_types"]


def write_manifest(a, base_info, produced):
    files = {}
    for name, spec in ADAPTERS.items():
        digest, size = produced[name]
        n_tensors, types = adapter_tensor_summary(os.path.join(a.dir, spec["file"]))
        files[name] = {
            "file": spec["file"],
            "sha256": digest,
            "size": size,
            "base": base_info[spec["base"]]["file"],
            "base_sha256": base_info[spec["base"]]["sha256"],
            "rank": spec["rank"],
            "alpha": spec["alpha"],
            "type": spec["type"],
            "seed": spec["seed"],
            "strength": STRENGTH,
            "tensor_count": n_tensors,
            "tensor_types": types,
            "command": " ".join(["python", "scripts/make-lora-gguf.py", "--base", base_info[spec["base"]]["file"],
                                 "--out", spec["file"]] + make_cmd("", "", "", spec)[6:-1]),
        }
    doc = {
        "about": "Random LoRA adapters for the two small test models, made by `scripts/lora-gguf.sh "
                 "files` (scripts/make-lora-gguf.py) into ${INFERD_LORA_DIR:-$HOME/.cache/inferd/lora}; "
                 "their llama.cpp references are the <label>.json files beside this manifest (README.md).",
        "generator": "scripts/make-lora-gguf.py with gguf==0.19.0, numpy==2.4.6, pyyaml==6.0.3 "
                     "(pip --no-deps, in target/lora-venv); see its docstring for the values",
        "q8_0_note": "Q8_0 stores blocks of 32 values along a row (ne[0]); lora_b has ne[0] = rank = 8, "
                     "so in the q8_0 adapter lora_b falls back to F16, as llama.cpp's "
                     "convert_lora_to_gguf.py does on gguf's QuantError; lora_a (ne[0] = n_in) is Q8_0.",
        "bases": base_info,
        "files": files,
    }
    qp.write_json(a.manifest, doc)
    print(f"lora-gguf: wrote {a.manifest}", file=sys.stderr)


def cmd_spec(a):
    spec = ADAPTERS.get(a.name)
    if not spec:
        sys.exit(f"lora-gguf: unknown adapter {a.name}")
    print(f"{spec['file']}\t{spec['base']}")


def cmd_refs_one(a):
    manifest = load_manifest(a.manifest)
    name = next((n for n, s in ADAPTERS.items() if s["file"] == os.path.basename(a.adapter)), None)
    ent = manifest["files"].get(name) if name else None
    if not ent:
        sys.exit(f"lora-gguf: {a.adapter} is not in {a.manifest}")
    qp.cmd_refs_one(a)
    with open(a.out) as f:
        doc = json.load(f)
    adapter = {
        "file": ent["file"],
        "sha256": sha256_of(a.adapter),
        "size": os.path.getsize(a.adapter),
        "rank": ent["rank"],
        "alpha": ent["alpha"],
        "type": ent["type"],
        "tensor_types": ent["tensor_types"],
        "seed": ent["seed"],
        "strength": ent["strength"],
        "scale": float(a.scale),
        "effective_scale": float(a.scale) * ent["alpha"] / ent["rank"],
        "made_by": "scripts/lora-gguf.sh files (" + ent["command"] + ")",
        "how_applied": SCALE_DOC,
    }
    if adapter["sha256"] != ent["sha256"]:
        sys.exit(f"lora-gguf: {a.adapter} does not match the manifest")
    meta = {}
    for k, v in doc["meta"].items():
        meta[k] = v
        if k == "model_source":
            meta["adapter"] = adapter
    doc["meta"] = meta
    qp.write_json(a.out, doc)


def cmd_scale0(a):
    """The prompt set with the adapter at per-request scale 0, compared to the base reference."""
    url = a.url.rstrip("/")
    qp.REQUEST = dict(qp.REQUEST, lora=[{"id": 0, "scale": 0.0}])
    with open(a.base_ref) as f:
        base = json.load(f)
    prompts = qp.build_prompts(url, a.family)
    by_id = {p["id"]: p for p in base["prompts"]}
    bad, n_tok, max_dp = [], 0, 0.0
    for p in prompts:
        ref = by_id[p["id"]]
        if ref["prompt_token_ids"] != p["prompt_token_ids"]:
            bad.append(f"{p['id']}: prompt ids differ")
            continue
        gen, _, _, pos = qp.run_prompt(url, p["prompt_token_ids"])
        n_tok += len(gen)
        if gen != ref["generated_token_ids"]:
            bad.append(f"{p['id']}: generated ids differ")
            continue
        for x, y in zip(pos, ref["positions"]):
            max_dp = max(max_dp, abs(x[1] - y[1]), abs(x[3] - y[3]))
            if x[0] != y[0] or x[2] != y[2]:
                bad.append(f"{p['id']}: top-2 ids differ")
    verdict = "identical" if not bad and max_dp == 0 else ("same ids" if not bad else "DIFFERENT")
    print(f"lora-gguf: scale 0 vs {os.path.basename(a.base_ref)}: {len(prompts)} prompts, {n_tok} "
          f"tokens: {verdict} (largest probability difference {max_dp:.3g})" +
          ("".join("\n  " + b for b in bad)), file=sys.stderr)
    if bad:
        sys.exit(1)


def cmd_same(a):
    """Whether two reference JSONs agree: ids, and the largest probability difference."""
    with open(a.file) as f:
        x = {p["id"]: p for p in json.load(f)["prompts"]}
    with open(a.other) as f:
        y = {p["id"]: p for p in json.load(f)["prompts"]}
    ids_diff, max_dp, n = [], 0.0, 0
    for pid, p in x.items():
        q = y[pid]
        if p["generated_token_ids"] != q["generated_token_ids"]:
            ids_diff.append(pid)
        for u, v in zip(p["positions"], q["positions"]):
            # same context up to here; past the first differing token the contexts differ
            if u[0] == v[0] and u[2] == v[2]:
                max_dp = max(max_dp, abs(u[1] - v[1]), abs(u[3] - v[3]))
            n += 1
            if u[0] != v[0]:
                break
    print(f"  generated ids differ in {len(ids_diff)}/{len(x)} prompts {ids_diff}; largest top-1/top-2 "
          f"probability difference over the common prefix {max_dp:.3g} ({n} positions)", file=sys.stderr)
    return 0 if not ids_diff and max_dp == 0 else 1


def compare(path, base_paths):
    with open(path) as f:
        doc = json.load(f)
    base = {}
    for bp in base_paths:
        with open(bp) as f:
            for p in json.load(f)["prompts"]:
                base.setdefault(p["id"], p)
    rows, tot_diff, tot = [], 0, 0
    for p in doc["prompts"]:
        b = base[p["id"]]
        g, h = p["generated_token_ids"], b["generated_token_ids"]
        n = max(len(g), len(h))
        diff = sum(1 for i in range(n) if i >= len(g) or i >= len(h) or g[i] != h[i])
        first = next((i for i in range(n) if i >= len(g) or i >= len(h) or g[i] != h[i]), None)
        tot_diff += diff
        tot += n
        rows.append((p["id"], diff, n, first, p["min_top1_top2_margin"]["p1_minus_p2"]))
    margin = min(r[4] for r in rows)
    return rows, tot_diff, tot, margin


def cmd_compare(a):
    rows, d, n, m = compare(a.file, a.base)
    for r in rows:
        print(f"  {r[0]:<18} {r[1]:>3}/{r[2]:<3} differ, first at {r[3]}, min margin {r[4]:.4g}")
    print(f"{os.path.basename(a.file)}: {d}/{n} generated tokens differ from the base; smallest "
          f"top1-top2 margin {m:.4g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("files")
    for k in ("--python", "--dir", "--manifest", "--smollm2", "--gemma3"):
        s.add_argument(k, required=True)
    s.add_argument("--update-manifest", action="store_true")
    s = sub.add_parser("spec")
    s.add_argument("name")
    s = sub.add_parser("refs-one")
    for k in ("--url", "--model", "--label", "--out", "--bin", "--build-info", "--server-cmd",
              "--model-source", "--adapter", "--scale", "--manifest"):
        s.add_argument(k, required=True)
    s.add_argument("--family", choices=("smollm2", "gemma3", "own"), required=True)
    s = sub.add_parser("scale0")
    for k in ("--url", "--base-ref"):
        s.add_argument(k, required=True)
    s.add_argument("--family", choices=("smollm2", "gemma3", "own"), required=True)
    s = sub.add_parser("same")
    s.add_argument("file")
    s.add_argument("other")
    s = sub.add_parser("compare")
    s.add_argument("file")
    s.add_argument("base", nargs="+")
    a = ap.parse_args()
    sys.exit({"files": cmd_files, "spec": cmd_spec, "refs-one": cmd_refs_one, "scale0": cmd_scale0,
              "same": cmd_same, "compare": cmd_compare}[a.cmd](a))


if __name__ == "__main__":
    main()
