#!/usr/bin/env python3
"""Image-input latency, inferd against llama.cpp's llama-server (--mmproj), same GGUF files,
same machine, same run.

Per family of daemon/tests/fixtures/vlm-gguf/ (gemma3, qwen2_5_vl, llava: both servers;
smolvlm: inferd only, llama.cpp refuses it), one server at a time: start inferd, run the
cases, stop it; start llama-server, run the same cases, stop it. Cases:

  native   one noise PNG at the tower's own size (no resize)
  640x480  one noise PNG of 640x480 (both servers resize it)
  text     no image (baseline)

Each case: WARMUP requests, then N measured ones, sequential, streaming, greedy,
max_tokens 1. Every request has a never-seen image (noise, its own seed) and its own text,
so no cache can hit; inferd's prefix cache and disk store are off (llama.cpp gets
cache_prompt false and --cache-ram 0). The same image bytes and texts go to both servers.

TTFT: client side (time.perf_counter), from sending the request (connection already open)
to the first SSE chunk that carries content or a finish_reason (the role-only chunk does
not count). Encode time: inferd from /metrics deltas of inferd_image_encode_seconds
(sum/count) per request; llama.cpp from its log (-lv 4 --log-timestamps, microsecond
stamps): from "encoding mtmd batch" to "decoding image batch 1/" (mtmd_batch_encode: the
CLIP graph; preprocessing happened before, at tokenization, as in inferd where the
pixels are prepared before the tower runs).

Also recorded per request: server-side TTFT (inferd: inferd_time_to_first_token_seconds
delta; llama.cpp: timings.prompt_ms), prompt tokens (usage), PNG and request bytes.

Writes target/bench/vision.json (raw samples, commands, versions, machine) and prints a
table. Run through scripts/bench-vision.sh (checks the release binary, picks the python).
"""
import argparse
import base64
import datetime
import http.client
import io
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "daemon/tests/fixtures/vlm-gguf")
DEFAULT_LLAMA = os.path.expanduser(
    "~/.cache/inferd/llamacpp-0.3.36/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"
)

# family -> (native W, H), whether llama.cpp serves it
FAMILIES = {
    "gemma3": ((32, 32), True),
    "qwen2_5_vl": ((84, 84), True),
    "llava": ((24, 24), True),
    "smolvlm": ((64, 64), False),  # llama.cpp: 400 Invalid token (fixture README)
}
CASES = ["native", "640x480", "text"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def png_noise(w, h, seed):
    px = np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(px, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def cpu_busy(seconds=1.0):
    """Fraction of all CPUs busy over `seconds` (/proc/stat), measured while this script
    runs no server: anything well above 0 means another process competes for the cores
    (both servers busy-wait their compute threads, so the numbers would be noise)."""
    def read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + v[4]
        return sum(v), idle
    t0, i0 = read()
    time.sleep(seconds)
    t1, i1 = read()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def pct(xs, q):
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------- requests


def make_requests(family, case, n, seed_base):
    """The requests of one (family, case): list of (text, png bytes or None)."""
    (nw, nh), _ = FAMILIES[family]
    out = []
    for i in range(n):
        seed = seed_base + i
        if case == "text":
            out.append((f"Tell me about topic {seed}.", None))
        else:
            w, h = (nw, nh) if case == "native" else (640, 480)
            out.append((f"Describe image {seed}.", png_noise(w, h, seed)))
    return out


def body(text, png, max_tokens, llama):
    if png is None:
        content = text
    else:
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        content = [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": text},
        ]
    b = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if llama:
        b["cache_prompt"] = False
    return json.dumps(b).encode()


def stream_request(port, payload):
    """POST one streaming chat completion. Returns dict with ttft (s, to the first chunk
    with content or finish_reason), first_chunk (s, any chunk), total (s), usage,
    timings (llama.cpp), content."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.connect()
    t0 = time.perf_counter()
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=payload,
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
    )
    resp = conn.getresponse()
    if resp.status != 200:
        err = resp.read().decode(errors="replace")
        conn.close()
        raise RuntimeError(f"HTTP {resp.status}: {err[:500]}")
    first_chunk = ttft = None
    usage = timings = None
    content = ""
    finish = None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        now = time.perf_counter()
        if data == b"[DONE]":
            break
        if first_chunk is None:
            first_chunk = now - t0
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        if ev.get("timings"):
            timings = ev["timings"]
        for ch in ev.get("choices") or []:
            c = (ch.get("delta") or {}).get("content")
            if c:
                content += c
            if (c or ch.get("finish_reason")) and ttft is None:
                ttft = now - t0
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    total = time.perf_counter() - t0
    conn.close()
    return dict(
        ttft=ttft, first_chunk=first_chunk, total=total, usage=usage, timings=timings,
        content=content, finish_reason=finish,
    )


def http_get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


# ---------------------------------------------------------------- servers

METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
WANTED = {
    "inferd_image_encode_seconds_sum": "enc_sum",
    "inferd_image_encode_seconds_count": "enc_count",
    "inferd_images_encoded_total": "images",
    "inferd_time_to_first_token_seconds_sum": "ttft_sum",
    "inferd_time_to_first_token_seconds_count": "ttft_count",
    "inferd_prefill_tokens_total": "prefill_tokens",
}


def scrape(port):
    st, text = http_get(port, "/metrics")
    if st != 200:
        raise RuntimeError(f"/metrics: HTTP {st}")
    out = {v: 0.0 for v in WANTED.values()}
    for line in text.splitlines():
        m = METRIC_RE.match(line)
        if m and m.group(1) in WANTED:
            out[WANTED[m.group(1)]] += float(m.group(3))
    return out


class Server:
    def __init__(self, kind, cmd, env, log_path, port):
        self.kind, self.cmd, self.port, self.log_path = kind, cmd, port, log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.log_pos = 0

    def wait_ready(self, timeout=120):
        t = time.time()
        while time.time() - t < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited ({self.proc.returncode}); log {self.log_path}")
            try:
                # inferd: /ready (its /health answers while the model loads)
                st, _ = http_get(self.port, "/ready" if self.kind == "inferd" else "/health")
                if st == 200:
                    return time.time() - t
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.kind} not ready after {timeout}s; log {self.log_path}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def new_log(self):
        with open(self.log_path, "rb") as f:
            f.seek(self.log_pos)
            data = f.read()
        self.log_pos += len(data)
        return data.decode(errors="replace")


TS_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")


def ts(line):
    m = TS_RE.match(line)
    if not m:
        return None
    mi, s, ms, us = map(int, m.groups())
    return mi * 60 + s + ms / 1e3 + us / 1e6


def llama_log_segment(srv, want_image, timeout=2.0):
    """This request's lines of llama-server's log (its logger is asynchronous: wait for
    the print_timing 'total time' line). Returns (encode_ms, image_decode_ms, raw)."""
    buf = ""
    t = time.time()
    while time.time() - t < timeout:
        buf += srv.new_log()
        if "total time" in buf:
            break
        time.sleep(0.01)
    enc = dec = None
    t_enc = None
    for line in buf.splitlines():
        if "encoding mtmd batch" in line:
            t_enc = ts(line)
        elif "decoding image batch 1/" in line and t_enc is not None and enc is None:
            enc = (ts(line) - t_enc) * 1e3
        m = re.search(r"image decoded \(batch \d+/\d+\) in (\d+) ms", line)
        if m:
            dec = (dec or 0) + int(m.group(1))
    if want_image and enc is None:
        sys.stderr.write("bench-vision: no encode lines in llama-server's log for a request\n")
    return enc, dec, buf


def run_case(srv, family, case, reqs, warmup, max_tokens):
    llama = srv.kind == "llama.cpp"
    samples = []
    for i, (text, png) in enumerate(reqs):
        payload = body(text, png, max_tokens, llama)
        before = scrape(srv.port) if not llama else None
        if llama:
            srv.new_log()  # drop what came before
        r = stream_request(srv.port, payload)
        s = dict(
            warmup=i < warmup,
            ttft_ms=r["ttft"] * 1e3 if r["ttft"] is not None else None,
            first_chunk_ms=r["first_chunk"] * 1e3 if r["first_chunk"] is not None else None,
            total_ms=r["total"] * 1e3,
            prompt_tokens=(r["usage"] or {}).get("prompt_tokens"),
            finish_reason=r["finish_reason"],
            png_bytes=len(png) if png else 0,
            request_bytes=len(payload),
        )
        if llama:
            enc, dec, _ = llama_log_segment(srv, png is not None)
            s["encode_ms"] = enc
            s["image_llm_decode_ms_log"] = dec
            tm = r["timings"] or {}
            s["server_prompt_ms"] = tm.get("prompt_ms")
            s["server_prompt_n"] = tm.get("prompt_n")
        else:
            after = scrape(srv.port)
            d = {k: after[k] - before[k] for k in after}
            s["encode_ms"] = d["enc_sum"] * 1e3 if d["enc_count"] > 0 else None
            s["images_encoded"] = d["images"]
            s["server_ttft_ms"] = d["ttft_sum"] * 1e3 if d["ttft_count"] > 0 else None
            s["prefill_tokens"] = d["prefill_tokens"]
        samples.append(s)
    return samples


def summarize(samples):
    m = [s for s in samples if not s["warmup"]]
    t = [s["ttft_ms"] for s in m if s["ttft_ms"] is not None]
    srv_side = [s.get("server_ttft_ms", s.get("server_prompt_ms")) for s in m]
    return dict(
        n=len(t),
        ttft_median_ms=med(t),
        ttft_p90_ms=pct(t, 90) if t else None,
        ttft_min_ms=min(t) if t else None,
        encode_median_ms=med([s["encode_ms"] for s in m]),
        server_side_median_ms=med(srv_side),
        prompt_tokens=med([s["prompt_tokens"] for s in m]),
        request_bytes=med([s["request_bytes"] for s in m]),
    )


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inferd", default=os.path.join(ROOT, "target/release/inferd"))
    ap.add_argument("--llama-server", default=DEFAULT_LLAMA)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefix-caching", action="store_true",
                    help="leave inferd's in-memory prefix cache on (default off, as llama.cpp's cache_prompt false)")
    ap.add_argument("--out", default=os.path.join(ROOT, "target/bench/vision.json"))
    ap.add_argument("--logs", default=os.path.join(ROOT, "target/bench/vision-logs"))
    ap.add_argument("--inferd-log-level", default="info", help="RUST_LOG for inferd")
    a = ap.parse_args()

    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    os.makedirs(a.logs, exist_ok=True)
    t_start = time.time()

    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip() or None
        except Exception as e:  # noqa: BLE001
            return f"error: {e}"

    cpu = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    llama_ver = subprocess.run([a.llama_server, "--version"], capture_output=True, text=True)
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine=dict(nproc=os.cpu_count(), nproc_cmd=sh(["nproc"]), cpu_model=cpu, uname=sh(["uname", "-srm"])),
        inferd_commit=sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]),
        inferd_dirty=bool(sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])),
        inferd_binary=a.inferd,
        inferd_binary_mtime=datetime.datetime.fromtimestamp(os.path.getmtime(a.inferd)).isoformat(timespec="seconds"),
        llama_server=a.llama_server,
        llama_server_version=(llama_ver.stdout + llama_ver.stderr).strip(),
        n=a.n, warmup=a.warmup, max_tokens=a.max_tokens, threads=a.threads,
        inferd_prefix_caching=a.prefix_caching,
        loadavg_start=open("/proc/loadavg").read().strip(),
        ttft_definition="client side: request sent on an open connection -> first SSE chunk with "
                        "non-empty delta.content or a finish_reason",
        encode_definition=dict(
            inferd="delta of inferd_image_encode_seconds_sum per request (tower time of the step)",
            llamacpp="log timestamps (-lv 4 --log-timestamps): 'encoding mtmd batch' -> 'decoding image batch 1/'",
        ),
    )
    results = []
    families = [f for f in a.families.split(",") if f]
    for fi, fam in enumerate(families):
        d = os.path.join(FIXTURES, fam)
        model, mmproj = os.path.join(d, "model.gguf"), os.path.join(d, "mmproj.gguf")
        total = a.warmup + a.n
        reqs = {c: make_requests(fam, c, total, 1000 * (fi + 1) + 100 * ci) for ci, c in enumerate(CASES)}
        servers = ["inferd"] + (["llama.cpp"] if FAMILIES[fam][1] else [])
        for kind in servers:
            port = free_port()
            store = None
            if kind == "inferd":
                store = tempfile.mkdtemp(prefix="bench-vision-store-")
                cmd = [a.inferd, "serve", "--model", model, "--mmproj", mmproj, "--listen", f"127.0.0.1:{port}"]
                env = dict(os.environ)
                env.update({
                    "INFERD__PREFIX_STORE__PATH": store,
                    "INFERD__PREFIX_STORE__ENABLED": "false",
                    "INFERD__MODEL__THREADS": str(a.threads),
                    "RUST_LOG": a.inferd_log_level,
                })
                if not a.prefix_caching:
                    env["INFERD__SCHEDULER__PREFIX_CACHING"] = "false"
                env_shown = {k: v for k, v in env.items() if k.startswith("INFERD__") or k == "RUST_LOG"}
            else:
                cmd = [a.llama_server, "-m", model, "--mmproj", mmproj, "--host", "127.0.0.1", "--port", str(port),
                       "-c", "512", "-np", "1", "-t", str(a.threads), "-tb", str(a.threads), "--temp", "0",
                       "--jinja", "--no-webui", "--cache-ram", "0", "--no-mmproj-offload",
                       "-lv", "4", "--log-timestamps", "--log-prefix"]
                env = dict(os.environ)
                env_shown = {}
            busy = cpu_busy(1.0)
            if busy > 0.15:
                print(f"bench-vision: WARNING: the CPUs are {busy:.0%} busy before {fam}/{kind} starts: "
                      "another process competes, timings are not trustworthy", file=sys.stderr, flush=True)
            log_path = os.path.join(a.logs, f"{fam}-{kind}.log")
            print(f"bench-vision: {fam}: {kind} starting", file=sys.stderr, flush=True)
            srv = Server(kind, cmd, env, log_path, port)
            try:
                ready_s = srv.wait_ready()
                for case in CASES:
                    samples = run_case(srv, fam, case, reqs[case], a.warmup, a.max_tokens)
                    results.append(dict(
                        family=fam, case=case, server=kind, command=cmd, env=env_shown,
                        startup_s=ready_s, cpu_busy_before=busy, log=log_path, samples=samples, summary=summarize(samples),
                    ))
                    print(f"bench-vision: {fam} {case} {kind}: {results[-1]['summary']}", file=sys.stderr, flush=True)
            finally:
                srv.stop()
                if store:
                    shutil.rmtree(store, ignore_errors=True)

    # ratios
    by = {(r["family"], r["case"], r["server"]): r for r in results}
    for r in results:
        if r["server"] == "inferd":
            o = by.get((r["family"], r["case"], "llama.cpp"))
            a_, b_ = r["summary"]["ttft_median_ms"], o and o["summary"]["ttft_median_ms"]
            r["summary"]["ttft_ratio_inferd_over_llamacpp"] = a_ / b_ if (a_ and b_) else None
    meta["elapsed_s"] = time.time() - t_start
    meta["loadavg_end"] = open("/proc/loadavg").read().strip()
    meta["max_cpu_busy_before_a_server"] = max(r["cpu_busy_before"] for r in results)
    with open(a.out, "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)

    def fmt(x, p=2):
        return "-" if x is None else f"{x:.{p}f}"

    hdr = ("family", "case", "server", "TTFT med ms", "TTFT p90 ms", "encode med ms", "srv-side med ms",
           "prompt tok", "inferd/llama TTFT")
    rows = []
    for r in results:
        s = r["summary"]
        rows.append((r["family"], r["case"], r["server"], fmt(s["ttft_median_ms"]), fmt(s["ttft_p90_ms"]),
                     fmt(s["encode_median_ms"], 3), fmt(s["server_side_median_ms"]),
                     fmt(s["prompt_tokens"], 0), fmt(s.get("ttft_ratio_inferd_over_llamacpp"))))
    w = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)]
    print(" | ".join(h.ljust(n) for h, n in zip(hdr, w)))
    print("-+-".join("-" * n for n in w))
    for row in rows:
        print(" | ".join(str(x).ljust(n) for x, n in zip(row, w)))
    if meta["max_cpu_busy_before_a_server"] > 0.15:
        print(f"WARNING: CPUs up to {meta['max_cpu_busy_before_a_server']:.0%} busy with other work before a "
              "server started: rerun on an idle machine")
    print(f"\nN={a.n} measured (+{a.warmup} warm-up) per row; srv-side = inferd's "
          f"inferd_time_to_first_token_seconds / llama.cpp's timings.prompt_ms; "
          f"{meta['elapsed_s']:.0f} s; JSON: {a.out}")


if __name__ == "__main__":
    main()
