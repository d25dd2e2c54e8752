"""`ban_words_py`: the Python port of `plugins/ban_words`, a context processor that
guarantees the generated text (the concatenated bytes of the generated tokens) never
contains any of the configured words.

World: `context-processor-plugin` (inferd:plugin@0.1.1). The plugin never reads the
logits, so the host does not copy the 49,152-float row into Python at each step (that
copy alone costs about 15 ms through componentize-py's bindings); a step costs only the
work below plus lifting `ctx.generated`.

Config: `{"words": ["Paris", ...]}`, 1 to 64 non-empty strings of at most 256 bytes
(UTF-8). Validation and its messages are those of the Rust `ban_words` (strict JSON; an
unknown field, a missing or malformed `words` and each bad entry are named with the
value given, rendered as serde_json renders it), e.g.
`words: must have 1 to 64 entries, got 0` or
`words[1]: must be a non-empty string of at most 256 bytes, got ""`. Only the wording of
the JSON syntax error itself differs (Python's parser message, in serde_json's shape
`config: not valid JSON (<what> at line L column C)`).

Algorithm (exactly the Rust one, so both ban the same set at every step). A word can
appear in the text in two ways when the next token `t` is appended:
- entirely inside `t`: the *static* ban, every token whose bytes contain a word,
  precomputed in `configure` and banned at every step;
- starting in the text generated so far and ending inside `t`: when the text ends with
  `w[:k]` (0 < k < len(w)), every token whose bytes start with `w[k:]` is banned (the
  *dynamic* ban).
The tokens that are neither control tokens, nor empty, nor statically banned are sorted
by bytes, so "every token starting with X" is one contiguous range of that order.
Control tokens (e.g. `<|im_end|>`) are not text: never banned, and they add no bytes to
the generated text (a word split around one is still caught).

Cost notes:
- `configure` (once per request): the static bans come from `bytes.find` over the whole
  vocabulary blob per word (C speed; one Python step per occurrence), then one slice per
  token and one sort of the remaining tokens by bytes. The ranges of every `w[k:]` are
  binary-searched here too (at most 64 x 255 of them), grouped by the last byte of
  `w[:k]`. Measured on SmolLM2's 49,152 tokens: about 100 ms in the component (30-50 ms
  in native CPython), within the default 1,000 ms `configure_deadline_ms`.
- `process` (per step): folds the newly generated tokens into a tail of the last
  `longest word - 1` bytes, then tests `tail.endswith(w[:k])` only for the prefixes
  ending with the tail's last byte, sorts the few matching ranges and copies the static
  list plus those ranges. Nothing proportional to the vocabulary except copying the
  static list (and the bindings lowering the ban list). Measured in the component:
  about 0.1 ms per step for `["Paris"]` (400 steps, lifting `ctx.generated` included),
  about 1 ms when a short word (e.g. "ing") bans some 3,000 tokens at every step.
"""

import json
import math
from bisect import bisect_left, bisect_right
from typing import Dict, List, Optional, Tuple

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, types

# Most words a config may list.
MAX_WORDS = 64
# Longest word, in bytes.
MAX_WORD_BYTES = 256
# Longest rendering of a rejected value in an error message, in bytes (guest-support).
SHOW_MAX = 80
# The JSON integers serde_json keeps as integers (others become f64).
_I64_MIN = -(1 << 63)
_U64_END = 1 << 64

# ---------------------------------------------------------------------------------------
# Strict JSON config, as plugins/guest-support (serde_json) parses and renders it
# ---------------------------------------------------------------------------------------


def _parse_int(text: str):
    value = int(text)
    if _I64_MIN <= value < _U64_END:
        return value
    return _parse_float(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError("number out of range")
    return value


def _parse_constant(text: str):
    raise ValueError(f"expected value, got {text}")


def _format_float(x: float) -> str:
    """`x` as serde_json writes an f64: shortest digits, `1e+16`, `1.5e-7`, `100.0`.
    (serde_json's default parser may round a long decimal 1 ulp away from Python's, so
    such a value can still render differently in its last digit.)"""
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    text = repr(x)
    sign = ""
    if text[0] == "-":
        sign, text = "-", text[1:]
    mantissa, _, exp = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    stripped = digits.rstrip("0")
    k = (int(exp) if exp else 0) - len(frac) + (len(digits) - len(stripped))
    digits = stripped
    length = len(digits)
    kk = length + k  # 10^(kk-1) <= |x| < 10^kk
    if 0 <= k and kk <= 16:
        out = digits + "0" * k + ".0"
    elif 0 < kk <= 16:
        out = digits[:kk] + "." + digits[kk:]
    elif -5 < kk <= 0:
        out = "0." + "0" * -kk + digits
    elif length == 1:
        out = f"{digits}e{kk - 1:+d}"
    else:
        out = f"{digits[0]}.{digits[1:]}e{kk - 1:+d}"
    return sign + out


def _render(value) -> str:
    """`value` as serde_json's compact `to_string` writes it (object keys sorted)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _format_float(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(_render(v) for v in value) + "]"
    return "{" + ",".join(f"{_render(k)}:{_render(value[k])}" for k in sorted(value)) + "}"


def show(value) -> str:
    """Renders a JSON value for an error message, truncated to about 80 bytes."""
    text = _render(value).encode("utf-8")
    if len(text) <= SHOW_MAX:
        return text.decode("utf-8")
    return text[:SHOW_MAX].decode("utf-8", "ignore") + "\u2026"


def _check_strings(value) -> None:
    """serde_json refuses a lone surrogate escape (`"\\ud800"`); Python's parser keeps it."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, list):
        for v in value:
            _check_strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_strings(k)
            _check_strings(v)


def parse_config(config: str, fields: List[str]) -> dict:
    """Parses `config`, which must be a JSON object whose keys are all in `fields`."""
    try:
        value = json.loads(
            config,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
        _check_strings(value)
    except json.JSONDecodeError as e:
        raise Err(f"config: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
    except UnicodeEncodeError:
        raise Err("config: not valid JSON (lone surrogate in hex escape)")
    except (ValueError, RecursionError) as e:
        raise Err(f"config: not valid JSON ({e})")
    if not isinstance(value, dict):
        raise Err(f"config: must be a JSON object, got {show(value)}")
    unknown = sorted(k for k in value if k not in fields)
    if unknown:
        raise Err(f"{unknown[0]}: unknown field (known fields: {', '.join(fields)})")
    return value


def parse_words(config: str) -> List[bytes]:
    """Validates the config and returns the words as UTF-8 byte strings."""
    cfg = parse_config(config, ["words"])
    if "words" not in cfg:
        raise Err(f"words: required, a list of 1 to {MAX_WORDS} non-empty strings")
    items = cfg["words"]
    if not isinstance(items, list):
        raise Err(f"words: must be a list of strings, got {show(items)}")
    if not 1 <= len(items) <= MAX_WORDS:
        raise Err(f"words: must have 1 to {MAX_WORDS} entries, got {len(items)}")
    words = []
    for i, item in enumerate(items):
        word = item.encode("utf-8") if isinstance(item, str) else b""
        if not 0 < len(word) <= MAX_WORD_BYTES:
            raise Err(
                f"words[{i}]: must be a non-empty string of at most {MAX_WORD_BYTES} "
                f"bytes, got {show(item)}"
            )
        words.append(word)
    return words


# ---------------------------------------------------------------------------------------
# The matcher
# ---------------------------------------------------------------------------------------


def _successor(prefix: bytes) -> Optional[bytes]:
    """The least byte string greater than every string starting with `prefix` (None if
    there is none, i.e. `prefix` is all 0xff)."""
    stem = prefix.rstrip(b"\xff")
    if not stem:
        return None
    return stem[:-1] + bytes([stem[-1] + 1])


class Matcher:
    """The vocabulary with what `ban_words` precomputes from it."""

    def __init__(self, words: List[bytes], blob: bytes, offsets: List[int], control: List[int]):
        vocab = max(len(offsets) - 1, 0)
        is_control = bytearray(vocab)
        for cid in control:
            if 0 <= cid < vocab:
                is_control[cid] = 1
        # Static bans: every occurrence of a word in the blob that lies inside one token.
        static = bytearray(vocab)
        for word in words:
            size = len(word)
            pos = blob.find(word)
            while pos != -1:
                i = bisect_right(offsets, pos) - 1
                if 0 <= i < vocab and pos + size <= offsets[i + 1] and not is_control[i]:
                    static[i] = 1
                    pos = blob.find(word, offsets[i + 1])
                else:
                    pos = blob.find(word, pos + 1)
        # The bytes each token adds to the text (none for control tokens).
        text = [blob[offsets[i] : offsets[i + 1]] for i in range(vocab)]
        for i in range(vocab):
            if is_control[i]:
                text[i] = b""
        self.text: List[bytes] = text
        self.vocab = vocab
        self.static_bans: List[int] = [i for i in range(vocab) if static[i]]
        # Every other non-control, non-empty token, sorted by bytes.
        order = [i for i in range(vocab) if text[i] and not static[i]]
        order.sort(key=text.__getitem__)
        self.sorted: List[int] = order
        keys = [text[i] for i in order]
        self.max_word_len = max(len(w) for w in words)
        # For each (word, k): the range in `sorted` of the tokens starting with w[k:],
        # keyed by the last byte of w[:k] (the tail must end with that byte).
        by_last: Dict[int, List[Tuple[bytes, int, int]]] = {}
        seen = set()
        for word in words:
            for k in range(1, len(word)):
                prefix, rest = word[:k], word[k:]
                if (prefix, rest) in seen:
                    continue
                seen.add((prefix, rest))
                start = bisect_left(keys, rest)
                succ = _successor(rest)
                end = len(keys) if succ is None else bisect_left(keys, succ, start)
                if start < end:
                    by_last.setdefault(prefix[-1], []).append((prefix, start, end))
        self.by_last = by_last

    def banned(self, tail: bytes) -> List[int]:
        """Every token that must not follow a text ending with `tail`: the static bans
        plus each token starting with `w[k:]` where `tail` ends with `w[:k]`; no
        duplicates. Returns `static_bans` itself when nothing else applies."""
        if not tail:
            return self.static_bans
        candidates = self.by_last.get(tail[-1])
        if not candidates:
            return self.static_bans
        ranges = [(s, e) for prefix, s, e in candidates if tail.endswith(prefix)]
        if not ranges:
            return self.static_bans
        # Ranges over `sorted` are disjoint or nested (one remainder a prefix of the
        # other): merge them so each token is listed once.
        ranges.sort()
        out = list(self.static_bans)
        covered = 0
        order = self.sorted
        for start, end in ranges:
            if start < covered:
                start = covered
            if start < end:
                out += order[start:end]
                covered = end
        return out


# ---------------------------------------------------------------------------------------
# Per-request state (the daemon instantiates a plugin once per request)
# ---------------------------------------------------------------------------------------

_matcher: Optional[Matcher] = None
# The last `max_word_len - 1` bytes of the generated text.
_tail = b""
# How many of `ctx.generated` are already folded into `_tail`.
_consumed = 0


def push_tail(tail: bytes, ids: List[int], matcher: Matcher) -> bytes:
    """Appends the text bytes of `ids` to `tail`, keeping its last `max_word_len - 1`."""
    keep = matcher.max_word_len - 1
    if keep == 0:
        return b""
    text, vocab = matcher.text, matcher.vocab
    parts = [tail]
    for tid in ids:
        if tid < vocab:
            parts.append(text[tid])
    joined = b"".join(parts)
    return joined[-keep:] if len(joined) > keep else joined


class ContextProcessor(exports.ContextProcessor):
    def info(self) -> types.PluginInfo:
        return types.PluginInfo(
            name="ban_words_py",
            version="0.1.0",
            description="Bans tokens so the generated text never contains any listed word (Python)",
        )

    def configure(self, config: str, seed: int) -> None:
        global _matcher, _tail, _consumed
        words = parse_words(config)
        blob = host.vocab_bytes()
        special = host.special_tokens()
        _matcher = Matcher(words, blob.bytes, blob.offsets, special.control)
        _tail = b""
        _consumed = 0

    def process(self, ctx: types.StepContext) -> types.LogitsEdit:
        global _tail, _consumed
        matcher = _matcher
        if matcher is None:
            raise Err("ban_words_py: process called before configure")
        generated = ctx.generated
        if len(generated) < _consumed:
            # Not expected (one instance per request); start over from the list.
            _tail, _consumed = b"", 0
        if len(generated) > _consumed:
            _tail = push_tail(_tail, generated[_consumed:], matcher)
            _consumed = len(generated)
        banned = matcher.banned(_tail)
        if not banned:
            return types.LogitsEdit_Keep()
        return types.LogitsEdit_Ban(banned)
