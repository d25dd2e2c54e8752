#!/usr/bin/env python3
"""llama.cpp through llama-cpp-python's low-level API: the `Engine` of the prefix
scenario's peer (`peer_prefix_llama_cpp.py`, `inferd-bench --scenario prefix`).

The serving scenario no longer runs this script: it measures native llama-server and
llama-bench (docs/bench-harness.md). Its own main below still runs stand-alone, as the
serving peer it used to be (issue 3):

Measures the same figures as the Rust harness measures on inferd, on the same GGUF with
the same thread count, using llama.cpp's own batching the way llama-server's parallel
slots do: every step is one llama_batch holding one token per decoding sequence plus
prompt tokens of newly admitted sequences (seq_id per sequence, one llama_decode per
step, greedy argmax per sequence). The KV cache is one unified cache of n_ctx cells
(f16 K and V, like inferd's budget in bytes); sequences are admitted while their prompt
plus max_tokens fits, the rest wait, as in a server.

Figures (JSON on stdout, the shape of inferd-bench's `Figures`):
  prefill      single stream, max_tokens 1: prompt_tokens / TTFT, best of the prompts
  decode       single stream, max_tokens tokens: (tokens - 1) / (last - first token),
               best of decode_reps runs
  concurrency  N sequences started at once: aggregate tok/s, mean TTFT, mean ITL, ...
  peak_rss     VmHWM of this process minus its VmRSS after imports (the Python
               interpreter and numpy), i.e. what llama.cpp itself adds; raw values in extra

Usage:
  peer_llama_cpp.py --spec spec.json          # written by inferd-bench
  peer_llama_cpp.py --model M.gguf --threads 2 --n-ctx 4096 --concurrency 1,4 \
                    --max-tokens 32             # stand-alone, built-in prompts
"""

import argparse
import ctypes
import json
import math
import os
import sys
import time


def proc_status_kib(field):
    """A kB field of /proc/self/status (e.g. VmHWM), in KiB; None if unreadable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


BASELINE_RSS_KIB = None


def log(msg):
    print(f"peer: {msg}", file=sys.stderr, flush=True)


def percentile(sorted_values, q):
    """Nearest-rank percentile (same as the Rust side)."""
    if not sorted_values:
        return 0.0
    rank = math.ceil(q * len(sorted_values))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def mean(values):
    return sum(values) / len(values) if values else 0.0


class Engine:
    """One llama.cpp model and context with a unified KV cache of n_ctx cells."""

    def __init__(self, llama_cpp, np, model_path, threads, n_ctx, n_seq_max, n_batch,
                 extra_bufts=True):
        self.ll = llama_cpp
        self.np = np
        ll = llama_cpp
        ll.llama_backend_init()
        mparams = ll.llama_model_default_params()
        if hasattr(mparams, "use_extra_bufts"):
            mparams.use_extra_bufts = extra_bufts
        self.model = ll.llama_model_load_from_file(model_path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"cannot load {model_path}")
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(512, n_batch)
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        if hasattr(cparams, "kv_unified"):
            cparams.kv_unified = True
        self.ctx = ll.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError(
                f"cannot create a context (n_ctx {n_ctx}, n_seq_max {n_seq_max})"
            )
        self.n_ctx = ll.llama_n_ctx(self.ctx)
        self.n_batch = n_batch
        self.n_seq_max = n_seq_max
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_init(n_batch, 0, 1)
        self.flash_attn_type = getattr(cparams, "flash_attn_type", None)

    def tokenize(self, text):
        """Like inferd's raw prompts: BOS when the model asks for it, special-token text
        stays plain text."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (self.ll.llama_token * cap)()
        n = self.ll.llama_tokenize(self.vocab, data, len(data), buf, cap, True, False)
        if n < 0:
            raise RuntimeError(f"tokenize needs {-n} tokens")
        return list(buf[:n])

    def clear(self):
        self.ll.llama_memory_clear(self.mem, True)

    def _add(self, token, pos, seq, want_logits):
        b = self.batch
        i = b.n_tokens
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = 1 if want_logits else 0
        b.n_tokens = i + 1
        return i

    def run(self, prompts, max_tokens):
        """Serves `prompts` (lists of token ids) as if all arrived at t=0, continuous
        batching like llama-server: each step decodes one token of every running
        sequence plus prompt chunks of admitted ones within n_batch tokens. Returns per
        stream (token times in s since start, end time) and the wall time."""
        ll, np = self.ll, self.np
        self.clear()
        n = len(prompts)
        need = [len(p) + max_tokens for p in prompts]
        for i, k in enumerate(need):
            if k > self.n_ctx:
                raise RuntimeError(
                    f"prompt {i} needs {k} KV cells but n_ctx is {self.n_ctx}"
                )
        waiting = list(range(n))
        free_slots = list(range(self.n_seq_max))
        # per running request: slot, prompt position done, last token, generated count
        running = {}
        reserved = 0
        times = [[] for _ in range(n)]
        end = [0.0] * n
        max_parallel = 0
        t0 = time.perf_counter()
        while waiting or running:
            # Admit in arrival order while the KV reservation fits (no preemption).
            while waiting and free_slots and reserved + need[waiting[0]] <= self.n_ctx:
                r = waiting.pop(0)
                running[r] = {"slot": free_slots.pop(0), "done": 0, "last": None, "gen": 0}
                reserved += need[r]
            max_parallel = max(max_parallel, len(running))
            self.batch.n_tokens = 0
            rows = {}
            budget = self.n_batch
            for r, s in running.items():
                if s["last"] is not None:
                    rows[r] = self._add(s["last"], len(prompts[r]) + s["gen"] - 1, s["slot"], True)
                    budget -= 1
            for r, s in running.items():
                if s["last"] is None and budget > 0:
                    p = prompts[r]
                    take = min(budget, len(p) - s["done"])
                    for j in range(s["done"], s["done"] + take):
                        last = j == len(p) - 1
                        row = self._add(p[j], j, s["slot"], last)
                        if last:
                            rows[r] = row
                    s["done"] += take
                    budget -= take
            rc = ll.llama_decode(self.ctx, self.batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            now = time.perf_counter() - t0
            finished = []
            for r, row in rows.items():
                logits = np.ctypeslib.as_array(
                    ll.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,)
                )
                token = int(logits.argmax())
                s = running[r]
                s["gen"] += 1
                s["last"] = token
                times[r].append(now)
                if s["gen"] >= max_tokens or ll.llama_vocab_is_eog(self.vocab, token):
                    finished.append(r)
            for r in finished:
                s = running.pop(r)
                ll.llama_memory_seq_rm(self.mem, s["slot"], -1, -1)
                free_slots.append(s["slot"])
                reserved -= need[r]
                end[r] = now
        wall = time.perf_counter() - t0
        return times, end, wall, max_parallel


def level_figures(n, max_tokens, times, end, wall):
    """Same computation as figures::level_from on the Rust side (all streams start at 0)."""
    tokens = sum(len(t) for t in times)
    ttfts = [t[0] for t in times if t]
    gaps_all, stream_itls = [], []
    for t in times:
        gaps = [b - a for a, b in zip(t, t[1:])]
        if gaps:
            stream_itls.append(mean(gaps))
        gaps_all.extend(gaps)
    gaps_all.sort()
    wall = max(end) if end else wall
    return {
        "n": n,
        "tokens": tokens,
        "wall_s": wall,
        "aggregate_tok_per_s": tokens / wall if wall > 0 else 0.0,
        "mean_ttft_ms": mean(ttfts) * 1e3,
        "max_ttft_ms": max(ttfts, default=0.0) * 1e3,
        "mean_itl_ms": mean(stream_itls) * 1e3,
        "p50_itl_ms": percentile(gaps_all, 0.50) * 1e3,
        "p99_itl_ms": percentile(gaps_all, 0.99) * 1e3,
        "short_streams": sum(1 for t in times if len(t) < max_tokens),
    }


def extra_bufts_work(model, threads):
    """Whether llama.cpp survives its extra CPU buffer types (AMX tiles, weight
    repacking) on this machine: some VMs report AMX in CPUID but trap on its
    instructions (SIGILL). Probed in a child process."""
    import subprocess

    probe = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--probe", "--model", model,
         "--threads", str(threads)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
    )
    return probe.returncode == 0


def run_probe(model, threads):
    import numpy as np
    import llama_cpp

    try:
        from llama_cpp._logger import set_verbose

        set_verbose(False)
    except ImportError:
        pass
    eng = Engine(llama_cpp, np, model, threads, 512, 2, 512, extra_bufts=True)
    eng.run([eng.tokenize("Hello, my name is"), eng.tokenize("The sky is")], 4)


def builtin_spec(args):
    subjects = ["the Roman Empire", "volcanoes", "stars", "the printing press",
                "the human heart", "bird migration", "the French Revolution",
                "computer memory"]
    frames = ["The following is a long and detailed essay about {}.\n\nChapter 1.",
              "Lecture notes, part one: an introduction to {}.\n\nIn this lecture we will"]
    levels = [int(x) for x in args.concurrency.split(",") if x]
    prompts = []
    for i in range(max(levels)):
        text = frames[(i // len(subjects)) % len(frames)].format(subjects[i % len(subjects)])
        prompts.append(text if i < len(subjects) * len(frames) else f"({i}) {text}")
    sentence = "The river winds through the valley for {} miles before it reaches the sea. "
    prefill = ["Report {}. ".format(v) + "".join(sentence.format(v * 100 + k) for k in range(40))
               for v in range(3)]
    return {
        "model": args.model,
        "threads": args.threads,
        "n_ctx": args.n_ctx,
        "max_tokens": args.max_tokens,
        "prefill_prompts": prefill,
        "decode_prompt": frames[0].format("the history of mathematics"),
        "decode_reps": 3,
        "concurrency": levels,
        "concurrent_prompts": prompts,
    }


def main():
    global BASELINE_RSS_KIB
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", help="JSON spec written by inferd-bench")
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n-batch", type=int, default=2048,
                    help="most tokens per llama_decode (llama-server's default)")
    ap.add_argument("--extra-bufts", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp's extra CPU buffer types (AMX, repacked weights); "
                         "auto: on unless a probe process crashes with them")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        run_probe(args.model, args.threads)
        return
    if args.spec:
        with open(args.spec) as f:
            spec = json.load(f)
    else:
        if not args.model:
            ap.error("--model or --spec is required")
        spec = builtin_spec(args)

    import numpy as np
    import llama_cpp

    try:
        from llama_cpp._logger import set_verbose

        set_verbose(False)
    except ImportError:
        pass
    BASELINE_RSS_KIB = proc_status_kib("VmRSS")

    threads = int(spec["threads"])
    max_tokens = int(spec["max_tokens"])
    levels = [int(n) for n in spec["concurrency"]]
    max_seq = min(max(levels + [1]), llama_cpp.llama_max_parallel_sequences())
    n_batch = max(args.n_batch, max_seq)
    if args.extra_bufts == "auto":
        extra_bufts = extra_bufts_work(spec["model"], threads)
        if not extra_bufts:
            log("extra buffer types (AMX/repack) crash on this machine; running without them")
    else:
        extra_bufts = args.extra_bufts == "on"
    eng = Engine(llama_cpp, np, spec["model"], threads, int(spec["n_ctx"]), max_seq, n_batch,
                 extra_bufts)
    log(f"llama-cpp-python {llama_cpp.__version__}, n_ctx {eng.n_ctx}, n_seq_max {max_seq}, "
        f"{threads} threads")

    # Warm-up (page in the weights, as the harness does for inferd).
    eng.run([eng.tokenize("Hello, my name is")], 8)

    # Prefill: max_tokens 1, best of the prompts.
    prefill_ttft, best, prefill_tokens = [], 0.0, None
    for text in spec["prefill_prompts"]:
        ids = eng.tokenize(text)
        times, _, _, _ = eng.run([ids], 1)
        ttft = times[0][0]
        prefill_ttft.append(ttft * 1e3)
        best = max(best, len(ids) / ttft)
        if prefill_tokens is None:
            prefill_tokens = len(ids)
    log(f"prefill {prefill_tokens} tokens: best {best:.1f} tok/s")

    # Single-stream decode.
    ids = eng.tokenize(spec["decode_prompt"])
    decode = None
    for _ in range(int(spec.get("decode_reps", 1))):
        times, _, _, _ = eng.run([ids], max_tokens)
        t = times[0]
        span = t[-1] - t[0] if len(t) > 1 else 0.0
        run = {
            "prompt_tokens": len(ids),
            "tokens": len(t),
            "span_s": span,
            "tok_per_s": (len(t) - 1) / span if span > 0 else 0.0,
            "ttft_ms": t[0] * 1e3 if t else 0.0,
        }
        if decode is None or run["tok_per_s"] > decode["tok_per_s"]:
            decode = run
    log(f"decode {len(t)} tokens: {decode['tok_per_s']:.1f} tok/s")

    # Concurrency levels.
    out_levels, max_parallel = [], {}
    for n in levels:
        prompts = [eng.tokenize(p) for p in spec["concurrent_prompts"][:n]]
        times, end, wall, par = eng.run(prompts, max_tokens)
        level = level_figures(n, max_tokens, times, end, wall)
        max_parallel[str(n)] = par
        out_levels.append(level)
        log(f"concurrency {n}: {level['aggregate_tok_per_s']:.1f} tok/s aggregate, "
            f"TTFT {level['mean_ttft_ms']:.0f} ms, ITL {level['mean_itl_ms']:.1f} ms, "
            f"{par} in parallel")

    hwm_kib = proc_status_kib("VmHWM")
    if hwm_kib is None:
        import resource

        hwm_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    baseline = BASELINE_RSS_KIB or 0
    result = {
        "prefill": {"prompt_tokens": prefill_tokens, "ttft_ms": prefill_ttft, "tok_per_s": best},
        "decode": decode,
        "concurrency": out_levels,
        "peak_rss_bytes": max(hwm_kib - baseline, 0) * 1024,
        "extra": {
            "llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace"),
            "n_ctx": eng.n_ctx,
            "n_seq_max": max_seq,
            "n_batch": n_batch,
            "kv_unified": True,
            "use_extra_bufts": extra_bufts,
            "flash_attn_type": eng.flash_attn_type,
            "threads": threads,
            "max_parallel": max_parallel,
            "vm_hwm_bytes": hwm_kib * 1024,
            "baseline_rss_bytes": baseline * 1024,
            "rss_note": "peak_rss_bytes = VmHWM - VmRSS after importing llama_cpp and numpy",
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
