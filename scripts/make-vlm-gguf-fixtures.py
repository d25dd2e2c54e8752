#!/usr/bin/env python3
"""make-vlm-gguf-fixtures.py - helper of scripts/make-vlm-gguf-fixtures.sh (see there and
daemon/tests/fixtures/vlm-gguf/README.md).

  images  OUT                      test PNGs per family into OUT/<family>/
  convert LLAMA_CPP SRC OUT [FAM]  GGUF model.gguf + mmproj.gguf per family (SRC = daemon/tests/fixtures/vlm)
  refs    LLAMA_CPP OUT [FAM]      llama-server greedy answers -> OUT/<family>/reference.json

LLAMA_CPP is a llama.cpp source tree with a native build in build/bin (llama-server, llama-mtmd-cli).
The python running this needs numpy, Pillow, torch, transformers, safetensors, sentencepiece, PyYAML.
"""
import base64
import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

FAMILIES = ["gemma3", "qwen2_5_vl", "llava", "smolvlm"]

# (kind, width, height) per family: sizes where llama.cpp's preprocessing resizes nothing
#   gemma3: clip image_size 32 (fixed-size resize to 32x32)
#   qwen2_5_vl: multiples of 28 with at least 8 merged tokens (llama.cpp: set_limit_image_tokens(8, ...)):
#               84x84 -> 3x3 = 9 tokens, 112x56 -> 4x2 = 8 tokens
#   llava: image_size 24 (square, no pad/crop)
#   smolvlm: longest edge 64 (preproc size) = 2x2 tiles of 32 + global
IMAGES = {
    "gemma3": [("grad", 32, 32), ("noise", 32, 32)],
    "qwen2_5_vl": [("grad", 84, 84), ("noise", 112, 56)],
    "llava": [("grad", 24, 24), ("noise", 24, 24)],
    "smolvlm": [("grad", 64, 64), ("noise", 64, 64)],
}
IMAGE_RECIPES = {
    "grad": "pixel (x, y) = (x*7 % 256, y*11 % 256, (x*y) % 256), RGB",
    "noise": "np.random.default_rng(1).integers(0, 256, (h, w, 3), uint8), RGB",
}
PROMPT_TEXT = "Describe this image."
PROMPT_TEXT_2 = "Compare the two images."
MAX_TOKENS = 8
MEDIA_MARKER = "<__media__>"  # pinned with LLAMA_MEDIA_MARKER (else llama-server picks a random one)


def image_name(kind, w, h):
    return f"{kind}_{w}x{h}.png"


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------------------------
# images
# ------------------------------------------------------------------------------------------------------------

def make_image(kind, w, h):
    import numpy as np
    if kind == "grad":
        y, x = np.mgrid[0:h, 0:w]
        return np.stack([(x * 7) % 256, (y * 11) % 256, (x * y) % 256], axis=-1).astype(np.uint8)
    if kind == "noise":
        return np.random.default_rng(1).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    raise ValueError(kind)


def cmd_images(out, families):
    from PIL import Image
    for fam in families:
        d = out / fam
        d.mkdir(parents=True, exist_ok=True)
        for kind, w, h in IMAGES[fam]:
            Image.fromarray(make_image(kind, w, h), "RGB").save(d / image_name(kind, w, h), format="PNG")
            print(f"{fam}: {image_name(kind, w, h)} {sha256(d / image_name(kind, w, h))}", flush=True)


# ------------------------------------------------------------------------------------------------------------
# conversion
# ------------------------------------------------------------------------------------------------------------

# convert_hf_to_gguf.py with one patch (the vendored script is not edited): our locally trained vocabulary has
# a pre-tokenizer check hash unknown to the converter; its Split regex is Qwen2's, so answer "qwen2" then. The
# wrapper is scripts/make-vlm-fixtures.py's (--gguf-out), read from that file so the two cannot drift.
def _gguf_convert_source():
    text = (Path(__file__).resolve().parent / "make-vlm-fixtures.py").read_text()
    start = text.index('GGUF_CONVERT = r"""') + len('GGUF_CONVERT = r"""')
    return text[start:text.index('"""', start)]


GGUF_CONVERT = _gguf_convert_source()


def run(cmd, env=None, cwd=None):
    print("+ " + " ".join("<shim>" if "\n" in str(c) else str(c) for c in cmd), flush=True)
    r = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
        raise SystemExit(f"failed ({r.returncode}): " + " ".join("<shim>" if "\n" in str(c) else str(c)
                                                                 for c in cmd))
    return r


def py_env(lcpp):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONHASHSEED="0")
    env["PYTHONPATH"] = str(lcpp / "gguf-py") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def hf_convert(lcpp, src, out, mmproj=False):
    run([sys.executable, "-c", GGUF_CONVERT, lcpp, src, out, *(["--mmproj"] if mmproj else [])], env=py_env(lcpp))


def smolvlm_text_dir(src, dst):
    """The SmolVLM (Idefics3) text model as a plain LlamaForCausalLM directory."""
    from safetensors.torch import load_file, save_file
    dst.mkdir(parents=True)
    sd = load_file(str(src / "model.safetensors"))
    text = {}
    for k, v in sd.items():
        if k.startswith("model.text_model."):
            text["model." + k[len("model.text_model."):]] = v
        elif k == "lm_head.weight":
            text[k] = v
    save_file({k: text[k].contiguous() for k in sorted(text)}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    tc = dict(cfg["text_config"])
    tc["architectures"] = ["LlamaForCausalLM"]
    tc["model_type"] = "llama"
    tc["torch_dtype"] = "float32"
    (dst / "config.json").write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, dst / f)


def llava_mmproj(lcpp, src, out, tmp):
    """LLaVA-1.5 projector + CLIP tower through tools/mtmd/legacy-models (llava_surgery_v2.py, then
    convert_image_encoder_to_gguf.py --clip-model-is-vision --llava-projector)."""
    legacy = lcpp / "tools" / "mtmd" / "legacy-models"
    model = tmp / "llava-model"
    model.mkdir()
    shutil.copy(src / "model.safetensors", model / "model.safetensors")
    shutil.copy(src / "config.json", model / "config.json")
    # -C: vision tower tensors -> llava.clip (vision_model.*), multi_modal_projector.* -> llava.projector
    run([sys.executable, legacy / "llava_surgery_v2.py", "-C", "-m", model], env=py_env(lcpp))
    vit = tmp / "vit"
    vit.mkdir()
    shutil.copy(model / "llava.clip", vit / "pytorch_model.bin")
    shutil.copy(model / "llava.projector", vit / "llava.projector")
    cfg = json.loads((src / "config.json").read_text())
    vc = dict(cfg["vision_config"])
    vc["architectures"] = ["CLIPVisionModel"]
    vc["model_type"] = "clip_vision_model"
    vc.setdefault("projection_dim", cfg["text_config"]["hidden_size"])
    # no vision_feature_layer: the legacy converter then drops the last encoder layer (= feature layer -2)
    (vit / "config.json").write_text(json.dumps(vc, indent=2, sort_keys=True) + "\n")
    pp = json.loads((src / "preprocessor_config.json").read_text())
    run([sys.executable, "-c", LEGACY_CLIP_SHIM, legacy / "convert_image_encoder_to_gguf.py", "-m", vit, "--llava-projector",
         vit / "llava.projector", "--output-dir", vit / "out", "--clip-model-is-vision", "--use-f32",
         "--image-mean", *pp["image_mean"], "--image-std", *pp["image_std"]], env=py_env(lcpp))
    shutil.copy(vit / "out" / "mmproj-model-f32.gguf", out)


# convert_image_encoder_to_gguf.py expects transformers 4's CLIPVisionModel, which wraps the tower in a
# `vision_model` submodule (state_dict keys `vision_model.*`, `model.vision_model.encoder.layers.pop(-1)`);
# transformers 5 dropped that level. Run the legacy script with CLIPVisionModel wrapped back into it.
LEGACY_CLIP_SHIM = r"""
import runpy, sys, torch, transformers
script, *args = sys.argv[1:]
class _V4Layout(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.vision_model = inner
from transformers.models.clip.modeling_clip import CLIPVisionModel
_orig = CLIPVisionModel.from_pretrained
CLIPVisionModel.from_pretrained = classmethod(lambda cls, *a, **kw: _V4Layout(_orig(*a, **kw)))
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
"""


def cmd_convert(lcpp, src_root, out, families):
    for fam in families:
        src = src_root / fam
        d = out / fam
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="vlm-gguf-") as t:
            tmp = Path(t)
            if fam == "smolvlm":
                # fixed basename: the converter names the model after the directory
                txt = tmp / "smolvlm"
                smolvlm_text_dir(src, txt)
                hf_convert(lcpp, txt, d / "model.gguf")
            else:
                hf_convert(lcpp, src, d / "model.gguf")
            if fam == "llava":
                llava_mmproj(lcpp, src, d / "mmproj.gguf", tmp)
            else:
                hf_convert(lcpp, src, d / "mmproj.gguf", mmproj=True)
        for f in ("model.gguf", "mmproj.gguf"):
            print(f"{fam}: {f} {(d / f).stat().st_size} bytes {sha256(d / f)}", flush=True)


# ------------------------------------------------------------------------------------------------------------
# llama-server references
# ------------------------------------------------------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def http(url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        txt = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(txt)
        except ValueError:
            return e.code, {"raw": txt}


def server_argv(bin_dir, d, port):
    return [str(bin_dir / "llama-server"), "-m", str(d / "model.gguf"), "--mmproj", str(d / "mmproj.gguf"),
            "--host", "127.0.0.1", "--port", str(port), "-c", "512", "-np", "1", "-t", "1", "-tb", "1",
            "--temp", "0", "--jinja", "--no-warmup", "--no-mmproj-offload", "--no-webui", "--cache-ram", "0"]


def server_argv_display(argv):
    out = []
    for a in argv:
        if a.endswith("model.gguf") or a.endswith("mmproj.gguf"):
            a = Path(a).name
        elif a.endswith("llama-server"):
            a = "llama-server"
        out.append(a)
    return " ".join(out)


def data_url(path):
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def cases_for(fam):
    imgs = [image_name(*x) for x in IMAGES[fam]]
    return [
        ("grad", [imgs[0]], PROMPT_TEXT),
        ("noise", [imgs[1]], PROMPT_TEXT),
        ("two", imgs, PROMPT_TEXT_2),
    ]


def messages_for(images, text, d=None):
    content = []
    for im in images:
        url = data_url(d / im) if d is not None else im
        content.append({"type": "image_url", "image_url": {"url": url}})
    content.append({"type": "text", "text": text})
    return [{"role": "user", "content": content}]


def request_body(messages):
    return {"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": True,
            "top_logprobs": 1, "cache_prompt": False, "return_tokens": True, "stream": False}


def tokenize(base, text):
    st, r = http(base + "/tokenize", {"content": text, "add_special": False, "parse_special": True,
                                      "with_pieces": True})
    if st != 200:
        raise RuntimeError(f"/tokenize: {st} {r}")
    return [{"id": t["id"], "piece": t["piece"]} for t in r["tokens"]]


def run_case(base, d, name, images, text):
    msgs = messages_for(images, text, d)
    body = request_body(msgs)
    rec = {"name": name, "images": images,
           "messages": messages_for(images, text)}  # image_url.url = file name (relative to this folder)
    st, tmpl = http(base + "/apply-template", {"messages": msgs})
    if st == 200:
        rec["rendered_prompt"] = tmpl["prompt"]
        chunks = tmpl["prompt"].split(MEDIA_MARKER)
        rec["rendered_prompt_text_chunks_token_ids"] = [[t["id"] for t in tokenize(base, c)] for c in chunks]
        rec["rendered_prompt_text_chunks_pieces"] = [[t["piece"] for t in tokenize(base, c)] for c in chunks]
    else:
        rec["apply_template_error"] = tmpl
    st, r = http(base + "/v1/chat/completions", body)
    if st != 200:
        rec["refused"] = {"status": st, "response": r}
        return rec
    ch = r["choices"][0]
    rec["prompt_tokens"] = r["usage"]["prompt_tokens"]
    rec["completion_tokens"] = r["usage"]["completion_tokens"]
    rec["finish_reason"] = ch["finish_reason"]
    rec["content"] = ch["message"]["content"]
    toks = []
    for lp in (ch.get("logprobs") or {}).get("content", []):
        ent = {"id": lp.get("id"), "token": lp["token"], "bytes": lp["bytes"], "logprob": lp["logprob"]}
        top = lp.get("top_logprobs") or []
        if top:
            ent["top1"] = {"id": top[0].get("id"), "token": top[0]["token"], "logprob": top[0]["logprob"]}
        toks.append(ent)
    rec["chat_logprobs"] = toks
    rec["chat_logprob_ids"] = [t["id"] for t in toks]
    if "tokens" in ch:
        rec["return_tokens"] = ch["tokens"]
    # the native /completion endpoint with the rendered prompt (media markers) + multimodal_data must agree
    if "rendered_prompt" in rec:
        cbody = {"prompt": {"prompt_string": rec["rendered_prompt"],
                            "multimodal_data": [data_url(d / im).split(",", 1)[1] for im in images]},
                 "temperature": 0, "n_predict": MAX_TOKENS, "n_probs": 2, "cache_prompt": False,
                 "return_tokens": True}
        st, c = http(base + "/completion", cbody)
        if st == 200:
            probs = [{"id": e["id"], "token": e["token"], "bytes": e["bytes"], "logprob": e["logprob"],
                      "top2": [{"id": t["id"], "logprob": t["logprob"]} for t in e.get("top_logprobs", [])[:2]]}
                     for e in c.get("completion_probabilities", [])]
            margins = [e["top2"][0]["logprob"] - e["top2"][1]["logprob"] for e in probs if len(e["top2"]) == 2]
            rec["native_completion"] = {"content": c.get("content"), "tokens": c.get("tokens"),
                                        "tokens_evaluated": c.get("tokens_evaluated"), "stop_type": c.get("stop_type"),
                                        "completion_probabilities": probs,
                                        "min_top1_minus_top2_logprob": min(margins) if margins else None}
        else:
            rec["native_completion"] = {"error": c, "status": st}
    nat = rec.get("native_completion", {}).get("tokens")
    # the chat logprobs leave out tokens whose text is an incomplete UTF-8 sequence (llama-server sends text only
    # once it is valid UTF-8, and the logprobs with it); /completion's "tokens" (return_tokens) has every id
    rec["generated_token_ids"] = nat if nat is not None else rec.get("chat_logprob_ids")
    it = iter(nat or [])
    rec["chat_logprob_ids_are_subsequence_of_generated"] = nat is not None and all(t in it for t in rec["chat_logprob_ids"])
    rec["chat_content_equals_native_content"] = (nat is not None and
                                                 rec["content"] == rec["native_completion"].get("content"))
    return rec


def start_server(argv, log_path):
    env = dict(os.environ, LLAMA_MEDIA_MARKER=MEDIA_MARKER)
    log = open(log_path, "w")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    for _ in range(600):
        if p.poll() is not None:
            raise RuntimeError(f"llama-server exited {p.returncode}: " + Path(log_path).read_text()[-3000:])
        try:
            st, r = http(base + "/health", timeout=2)
            if st == 200:
                return p, base
        except OSError:
            pass
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("llama-server did not become healthy")


def mtmd_cli(bin_dir, d, image, text):
    argv = [str(bin_dir / "llama-mtmd-cli"), "-m", str(d / "model.gguf"), "--mmproj", str(d / "mmproj.gguf"),
            "--image", str(d / image), "-p", text, "--temp", "0", "-n", str(MAX_TOKENS), "--no-warmup",
            "-t", "1", "-c", "512", "--jinja"]
    r = subprocess.run(argv, capture_output=True, timeout=300)
    disp = shlex.join(Path(a).name if ("/" in a and not a.startswith("-")) else a for a in argv)
    err = r.stderr.decode("utf-8", "replace").splitlines()
    return {"command": disp, "returncode": r.returncode, "stdout": r.stdout.decode("utf-8", "replace"),
            "stdout_bytes": list(r.stdout),
            "stderr_tail": [l for l in err if "error" in l.lower() or "abort" in l.lower()
                            or "failed" in l.lower()][-5:]}


def gguf_kv(lcpp, path):
    """The GGUF's metadata, without the tokenizer arrays and the chat template (long)."""
    sys.path.insert(0, str(lcpp / "gguf-py"))
    import gguf
    rd = gguf.GGUFReader(str(path))
    out = {}
    for k, f in rd.fields.items():
        if k.startswith("GGUF.") or k.startswith("tokenizer.ggml.merges") or k in (
                "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores", "tokenizer.chat_template"):
            continue
        v = f.contents()
        if isinstance(v, float):
            v = float(f"{v:.9g}")
        elif isinstance(v, list):
            v = [float(f"{x:.9g}") if isinstance(x, float) else x for x in v]
        out[k] = v
    out["tensors"] = {t.name: [t.tensor_type.name, [int(x) for x in t.shape]] for t in rd.tensors}
    return out


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def gguf_vocab(lcpp, path):
    """[(text, token_type)] of the GGUF vocabulary."""
    sys.path.insert(0, str(lcpp / "gguf-py"))
    import gguf
    rd = gguf.GGUFReader(str(path))
    return list(zip(rd.fields["tokenizer.ggml.tokens"].contents(), rd.fields["tokenizer.ggml.token_type"].contents()))


def token_bytes(vocab, dec, tid):
    """What llama.cpp's token_to_piece(special=false) gives for a byte-level BPE token: the bytes of a normal token,
    the text of a user-defined one, nothing for a control token."""
    text, ttype = vocab[tid]
    if ttype == 3:  # CONTROL
        return b""
    if ttype == 4:  # USER_DEFINED
        return text.encode()
    return bytes(dec[ch] for ch in text)


def cmd_refs(lcpp, out, families):
    bin_dir = lcpp / "build" / "bin"
    ver = subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True, text=True)
    version = (ver.stdout + ver.stderr).strip().splitlines()
    for fam in families:
        d = out / fam
        port = free_port()
        argv = server_argv(bin_dir, d, port)
        log_path = Path(tempfile.gettempdir()) / f"vlm-gguf-{fam}-server.log"
        p, base = start_server(argv, log_path)
        try:
            _, props = http(base + "/props")
            cases = [run_case(base, d, n, ims, t) for n, ims, t in cases_for(fam)]
        finally:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        vocab, dec = gguf_vocab(lcpp, d / "model.gguf"), byte_decoder()
        for c in cases:
            if c.get("generated_token_ids") is not None:
                c["generated_tokens"] = [{"id": t, "piece": vocab[t][0], "bytes": list(token_bytes(vocab, dec, t))}
                                         for t in c["generated_token_ids"]]
                c["generated_bytes_utf8_lossy"] = b"".join(token_bytes(vocab, dec, t) for t in
                                                           c["generated_token_ids"]).decode("utf-8", "replace")
        cli = mtmd_cli(bin_dir, d, cases[0]["images"][0], PROMPT_TEXT)
        c0 = cases[0]
        server_bytes = bytes(b for t in c0.get("generated_tokens", []) for b in t["bytes"])
        cli["agrees_with_server_grad_bytes"] = (cli["returncode"] == 0 and bytes(cli["stdout_bytes"]).strip()
                                                == server_bytes.strip())
        if cli["returncode"] != 0:
            cli["stdout"] = "(a gdb backtrace of the abort: left out)"
            del cli["stdout_bytes"]
        ref = {
            "family": fam,
            "llama_cpp": {"version": version, "source": str(lcpp).replace(str(Path.home()), "~")},
            "server_command": "LLAMA_MEDIA_MARKER='<__media__>' " + server_argv_display(argv).replace(
                f"--port {port}", "--port PORT"),
            "request": {k: v for k, v in request_body("MESSAGES").items()} | {"messages": "see cases[].messages"},
            "chat_template_from_gguf": props.get("chat_template"),
            "model_gguf": {"file": "model.gguf", "bytes": (d / "model.gguf").stat().st_size,
                           "sha256": sha256(d / "model.gguf")},
            "mmproj_gguf": {"file": "mmproj.gguf", "bytes": (d / "mmproj.gguf").stat().st_size,
                            "sha256": sha256(d / "mmproj.gguf")},
            "images": [{"file": image_name(k, w, h), "width": w, "height": h, "recipe": IMAGE_RECIPES[k],
                        "sha256": sha256(d / image_name(k, w, h))} for k, w, h in IMAGES[fam]],
            "media_marker": MEDIA_MARKER,
            "cases": cases,
            "mtmd_cli_grad": cli,
            "model_gguf_metadata": gguf_kv(lcpp, d / "model.gguf"),
            "mmproj_gguf_metadata": gguf_kv(lcpp, d / "mmproj.gguf"),
        }
        (d / "reference.json").write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")
        for c in cases:
            print(json.dumps({"family": fam, "case": c["name"], "prompt_tokens": c.get("prompt_tokens"),
                              "content": c.get("content"), "chat_ids": c.get("chat_logprob_ids"),
                              "refused": c.get("refused"),
                              "generated": c.get("generated_token_ids"),
                              "subseq_ok": c.get("chat_logprob_ids_are_subsequence_of_generated"),
                              "content_ok": c.get("chat_content_equals_native_content"),
                              "min_margin": (c.get("native_completion") or {}).get("min_top1_minus_top2_logprob")}),
                  flush=True)
        print(json.dumps({"family": fam, "mtmd_cli": cli["stdout"].strip(), "rc": cli["returncode"],
                          "agrees": cli["agrees_with_server_grad_bytes"]}), flush=True)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd = sys.argv[1]
    if cmd == "images":
        cmd_images(Path(sys.argv[2]), sys.argv[3:] or FAMILIES)
    elif cmd == "convert":
        cmd_convert(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve(), Path(sys.argv[4]).resolve(),
                    sys.argv[5:] or FAMILIES)
    elif cmd == "refs":
        cmd_refs(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve(), sys.argv[4:] or FAMILIES)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
