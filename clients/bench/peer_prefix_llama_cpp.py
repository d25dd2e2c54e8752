#!/usr/bin/env python3
"""llama.cpp peer of `inferd-bench --scenario prefix` (issue 5): prompt-cache TTFT.

Measures the time to first token of chat prompts (a long shared system prompt plus a
short question) on llama.cpp through llama-cpp-python's low-level API, on the same GGUF
with the same thread count as inferd, the way llama-server's `cache_prompt` serves one
slot:

  cold  the KV cache is cleared first (llama_memory_clear): the whole prompt is
        decoded.
  warm  the KV cache still holds the previous request (its prompt and the tokens
        generated for it). The longest common prefix of that and the new prompt is
        kept, the rest of the sequence is dropped (llama_memory_seq_rm from the first
        differing position) and only the new suffix is decoded (at least one token, so
        there are logits to sample from). This is what llama-server does with
        cache_prompt (its default) within one slot, and what llama_cpp.Llama.generate
        does with its `_input_ids`.

Each request is greedy, max_tokens tokens (it stops early at an end-of-generation
token). TTFT = llama.cpp tokenizing the text + prefix match + llama_decode of the
(suffix of the) prompt + argmax of the last logits. The prompts' token ids come from
inferd (its `tokenize` of the ChatML text with special tokens); the script tokenizes the
same text itself inside the timed span and decodes inferd's ids, recording whether the
two tokenizations agree (`tokens_match`).

Input: --spec FILE (written by inferd-bench):
  {"model", "threads", "n_ctx", "max_tokens",
   "cold": [{"text", "ids"}, ...], "warm": [{"text", "ids"}, ...]}
Output (stdout, one JSON line):
  {"cold": [run, ...], "warm": [run, ...], "extra": {...}}
  run = {"ttft_ms", "prompt_tokens", "reused_tokens", "decoded_prompt_tokens",
         "tokens", "tokens_match"}
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peer_llama_cpp import Engine, extra_bufts_work, log  # noqa: E402


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Slot:
    """One llama-server slot: sequence 0 and the tokens its KV cells hold."""

    def __init__(self, eng):
        self.eng = eng
        self.cached = []

    def clear(self):
        self.eng.clear()
        self.cached = []

    def decode(self, tokens, start, want_last):
        """Decodes `tokens` at positions start.. in n_batch chunks; logits for the last
        one when `want_last`. Returns the batch row of the last token."""
        eng, ll = self.eng, self.eng.ll
        row = None
        for off in range(0, len(tokens), eng.n_batch):
            chunk = tokens[off:off + eng.n_batch]
            eng.batch.n_tokens = 0
            for j, tok in enumerate(chunk):
                last = want_last and off + j == len(tokens) - 1
                r = eng._add(tok, start + off + j, 0, last)
                if last:
                    row = r
            rc = ll.llama_decode(eng.ctx, eng.batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        return row

    def argmax(self, row):
        eng = self.eng
        logits = eng.np.ctypeslib.as_array(
            eng.ll.llama_get_logits_ith(eng.ctx, row), shape=(eng.n_vocab,)
        )
        return int(logits.argmax())

    def tokenize(self, text):
        """llama.cpp's tokens of a rendered chat prompt: special-token text such as
        <|im_start|> maps to its control id; BOS only if the model asks for it."""
        eng, ll = self.eng, self.eng.ll
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(eng.vocab, data, len(data), buf, cap, True, True)
        if n < 0:
            raise RuntimeError(f"tokenize needs {-n} tokens")
        return list(buf[:n])

    def request(self, text, ids, max_tokens):
        """Serves one prompt with prefix reuse; returns the run's figures."""
        eng, ll = self.eng, self.eng.ll
        t0 = time.perf_counter()
        own = self.tokenize(text)
        reuse = common_prefix(self.cached, ids)
        if reuse >= len(ids):
            reuse = len(ids) - 1  # decode at least one token to get logits
        ll.llama_memory_seq_rm(eng.mem, 0, reuse, -1)
        suffix = ids[reuse:]
        row = self.decode(suffix, reuse, True)
        token = self.argmax(row)
        ttft = time.perf_counter() - t0
        self.cached = list(ids)
        generated = 1
        while generated < max_tokens and not ll.llama_vocab_is_eog(eng.vocab, token):
            row = self.decode([token], len(self.cached), True)
            self.cached.append(token)
            token = self.argmax(row)
            generated += 1
        return {
            "ttft_ms": ttft * 1e3,
            "prompt_tokens": len(ids),
            "reused_tokens": reuse,
            "decoded_prompt_tokens": len(suffix),
            "tokens": generated,
            "tokens_match": own == list(ids),
        }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="JSON spec written by inferd-bench")
    ap.add_argument("--n-batch", type=int, default=2048,
                    help="most tokens per llama_decode (llama-server's default)")
    ap.add_argument("--extra-bufts", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp's extra CPU buffer types (AMX, repacked weights); "
                         "auto: on unless a probe process crashes with them")
    args = ap.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)

    import numpy as np
    import llama_cpp

    try:
        from llama_cpp._logger import set_verbose

        set_verbose(False)
    except ImportError:
        pass

    threads = int(spec["threads"])
    max_tokens = int(spec["max_tokens"])
    if args.extra_bufts == "auto":
        extra_bufts = extra_bufts_work(spec["model"], threads)
        if not extra_bufts:
            log("extra buffer types (AMX/repack) crash on this machine; running without them")
    else:
        extra_bufts = args.extra_bufts == "on"
    eng = Engine(llama_cpp, np, spec["model"], threads, int(spec["n_ctx"]), 1, args.n_batch,
                 extra_bufts)
    log(f"llama-cpp-python {llama_cpp.__version__}, n_ctx {eng.n_ctx}, {threads} threads, "
        f"prompt cache within one slot")
    slot = Slot(eng)

    # Warm-up (page in the weights), then an empty cache.
    warm_ids = eng.tokenize("Hello, my name is")
    slot.request("Hello, my name is", warm_ids, 8)

    cold = []
    for p in spec["cold"]:
        slot.clear()
        run = slot.request(p["text"], p["ids"], max_tokens)
        cold.append(run)
        log(f"cold: {run['prompt_tokens']} tokens, TTFT {run['ttft_ms']:.1f} ms")
    warm = []
    for p in spec["warm"]:
        run = slot.request(p["text"], p["ids"], max_tokens)
        warm.append(run)
        log(f"warm: {run['prompt_tokens']} tokens ({run['reused_tokens']} reused), "
            f"TTFT {run['ttft_ms']:.1f} ms")

    print(json.dumps({
        "cold": cold,
        "warm": warm,
        "extra": {
            "llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace"),
            "n_ctx": eng.n_ctx,
            "n_batch": args.n_batch,
            "n_ubatch": min(512, args.n_batch),
            "use_extra_bufts": extra_bufts,
            "flash_attn_type": eng.flash_attn_type,
            "threads": threads,
            "cache": "one slot; KV of the longest common prefix with the previous "
                     "request (prompt + generated tokens) kept, the rest removed with "
                     "llama_memory_seq_rm, only the suffix decoded",
        },
    }))


if __name__ == "__main__":
    main()
