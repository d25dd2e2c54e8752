#!/usr/bin/env python3
"""Throughput of several engines in one process (`[[engines]]`) against one engine
on the same cores, same run, alternating: for each side, start `inferd serve` with
configs/test.toml plus the side's engines, send CONCURRENCY greedy chat requests at
once over WebSocket (distinct prompts, `min_tokens` = `max_tokens` = TOKENS), and
time from the first send to the last `done`. Rounds alternate the sides (A B A B …)
so that the machine's drift hits both. Prints a markdown table and writes JSON.

    target/pyenv/bin/python scripts/bench-engines.py [--binary target/release/inferd]
        [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--rounds 3]
        [--concurrency 8] [--tokens 64] [--out target/bench/engines.json]

Sides: "1 engine x 2 threads" ([model] threads = 2) and "2 engines x 1 thread"
([[engines]] threads = 1, twice). Needs the `websockets` package.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import websockets

ROOT = Path(__file__).resolve().parent.parent

SIDES = {
    "1 engine x 2 threads": "",
    "2 engines x 1 thread": "\n[[engines]]\nthreads = 1\n\n[[engines]]\nthreads = 1\n",
}


def start(binary: str, model: str, extra: str, tmp: Path) -> tuple[subprocess.Popen, str]:
    base = (ROOT / "configs/test.toml").read_text()
    cfg = tmp / "bench.toml"
    cfg.write_text(base + extra)
    env = dict(os.environ, INFERD__PREFIX_STORE__PATH=str(tmp / "store"), INFERD__PLUGINS__DIR=str(tmp / "none"))
    p = subprocess.Popen(
        [binary, "serve", "--config", str(cfg), "--model", model, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert p.stdout is not None
    for line in p.stdout:
        m = re.search(r"listening on (ws://\S+)", line)
        if m:
            return p, m.group(1)
    raise SystemExit(f"{binary} exited before listening ({p.wait()})")


async def burst(url: str, concurrency: int, tokens: int, round_no: int) -> dict:
    async def one(i: int) -> int:
        async with websockets.connect(url, max_size=None) as ws:
            await ws.send(json.dumps({
                "type": "generate", "id": "r", "temperature": 0, "max_tokens": tokens, "min_tokens": tokens,
                "cache": False,
                "messages": [{"role": "user", "content": f"Story {round_no}-{i}: tell me about the number {i * 7 + round_no}."}],
            }))
            n = 0
            async for raw in ws:
                f = json.loads(raw)
                if f["type"] == "delta":
                    n += len(f.get("token_ids", []))
                elif f["type"] in ("done", "error"):
                    if f["type"] == "error":
                        raise SystemExit(f"request failed: {f}")
                    return n
            return n

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"tokens": sum(counts), "wall_s": wall, "tokens_per_s": sum(counts) / wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(ROOT / "target/release/inferd"))
    ap.add_argument("--model", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "target/bench/engines.json"))
    a = ap.parse_args()
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    for r in range(a.rounds):
        for side, extra in SIDES.items():
            with tempfile.TemporaryDirectory() as tmp:
                p, url = start(a.binary, a.model, extra, Path(tmp))
                try:
                    asyncio.run(burst(url, a.concurrency, 8, 1000 + r))  # warm-up
                    res = asyncio.run(burst(url, a.concurrency, a.tokens, r))
                finally:
                    p.terminate()
                    p.wait()
            runs[side].append(res)
            print(f"round {r} {side}: {res['tokens_per_s']:.1f} tokens/s", file=sys.stderr)
    base = list(SIDES)[0]
    median = {s: sorted(x["tokens_per_s"] for x in v)[len(v) // 2] for s, v in runs.items()}
    print(f"| side ({a.concurrency} requests at once, {a.tokens} tokens each) | tokens/s per round | median | vs {base} |")
    print("|---|---|---|---|")
    for s, v in runs.items():
        rounds = ", ".join(f"{x['tokens_per_s']:.1f}" for x in v)
        print(f"| {s} | {rounds} | {median[s]:.1f} | {median[s] / median[base]:.2f}x |")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"args": vars(a), "runs": runs, "median_tokens_per_s": median}, indent=1))


if __name__ == "__main__":
    main()
