"""`temperature_schedule_py`: a sampler whose temperature follows a linear schedule over
the generated tokens, e.g. exploratory at the start of an answer and greedy after it.

World: `sampler-plugin` (inferd:plugin@0.1.1). As the request's only sampler it replaces
the native top-k, top-p, min-p and temperature; the logits processors still run before
it.

Config (a JSON object, every field optional):
- `start`: temperature at the first step, a number from 0 to 100 (default 1.0);
- `end`: temperature from step `tokens` on, a number from 0 to 100 (default 0.0, i.e. greedy);
- `tokens`: length of the ramp in generated tokens, an integer from 1 to 1000000 (default 128;
  written as an integer: `3`, not `3.0`).
So `{}` cools linearly from 1.0 to greedy over the first 128 tokens, and
`{"start": 0.7, "end": 0.7}` is plain sampling at temperature 0.7.
Errors name the field, the bound and the value given (rendered as JSON), e.g.
`start: must be a number from 0 to 100, got -1`, `tokens: must be an integer from 1 to 1000000, got 2.5`;
an unknown field is refused (`nope: unknown field (known fields: start, end, tokens)`),
as are non-objects and invalid JSON (strict: no NaN/Infinity).

Per step, with k = len(ctx.generated) (the tokens generated so far):
    T = start + (end - start) * min(k, tokens) / tokens
- T == 0: argmax of the logits, the lowest id on ties (`logits.index(max(logits))`, two
  C-speed passes).
- T > 0: softmax over the finite logits, w_i = exp((x_i - max) / T) (negative infinity,
  a token removed by a processor, weighs exactly 0), then the inverse-CDF pick with the
  host's `random` r in [0, 1): the first token whose cumulative weight exceeds
  r * total. That token has a positive weight, so it is never a removed one; if rounding
  leaves no such token the last finite token is returned. A seeded request therefore
  reproduces exactly (the host draws r from the request's seed).

Cost notes (49,152 logits, measured in the component under wasmtime): the bindings
lift the row into a Python list before `sample` runs, 15-20 ms by themselves; the T > 0
pass adds about 11 ms (one plain loop: a subtraction, division, `math.exp`, addition
and append per token, then a `bisect` over the cumulative weights), the T = 0 argmax
about 1 ms. So about 30 ms a step: give the plugin a `call_deadline_ms` of 50 or more.
The loop was measured faster than `map`/`itertools.accumulate` chains (+24 ms), a list
comprehension plus `accumulate` (+16 ms) or a `compress` pre-filter of the logits below
max - 50 T (+33 ms).
"""

import json
import math
from bisect import bisect_right
from typing import List

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types

# Defaults of the three fields.
DEFAULT_START = 1.0
DEFAULT_END = 0.0
DEFAULT_TOKENS = 128
# The config's fields, in the order error messages list them.
FIELDS = ["start", "end", "tokens"]
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



def _number(cfg: dict, field: str, default: float) -> float:
    if field not in cfg:
        return default
    value = cfg[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise Err(f"{field}: must be a number from 0 to 100, got {show(value)}")
    return float(value)


def _integer(cfg: dict, field: str, default: int) -> int:
    if field not in cfg:
        return default
    value = cfg[field]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise Err(f"{field}: must be an integer from 1 to 1000000, got {show(value)}")
    return value


def parse_schedule(config: str):
    """Validates the config; returns (start, end, tokens)."""
    cfg = parse_config(config, FIELDS)
    return (
        _number(cfg, "start", DEFAULT_START),
        _number(cfg, "end", DEFAULT_END),
        _integer(cfg, "tokens", DEFAULT_TOKENS),
    )


def temperature(start: float, end: float, tokens: int, k: int) -> float:
    """The temperature at step `k` (tokens generated so far)."""
    return start + (end - start) * min(k, tokens) / tokens


def pick(logits: List[float], temp: float, r: float) -> int:
    """Chooses a token: argmax at temperature 0, else the inverse-CDF pick of `r` under
    softmax(logits / temp). Raises Err when no logit is finite."""
    top = max(logits) if logits else -math.inf
    if not top > -math.inf:
        raise Err("temperature_schedule_py: no finite logit")
    if temp <= 0.0:
        return logits.index(top)
    exp = math.exp
    total = 0.0
    cumulative = []
    append = cumulative.append
    for x in logits:
        total += exp((x - top) / temp)
        append(total)
    i = bisect_right(cumulative, r * total)
    if i < len(logits):
        return i
    # Rounding: r * total reached total. The last finite token.
    i = len(logits) - 1
    while not logits[i] > -math.inf:
        i -= 1
    return i


# Per-request state (the daemon instantiates a plugin once per request).
_schedule = None


class Sampler(exports.Sampler):
    def info(self) -> types.PluginInfo:
        return types.PluginInfo(
            name="temperature_schedule_py",
            version="0.1.0",
            description="Samples at a temperature moving linearly from start to end over the first tokens (Python)",
        )

    def configure(self, config: str, seed: int) -> None:
        global _schedule
        _schedule = parse_schedule(config)

    def sample(self, ctx: types.StepContext, logits: List[float], random: float) -> int:
        if _schedule is None:
            raise Err("temperature_schedule_py: sample called before configure")
        start, end, tokens = _schedule
        return pick(logits, temperature(start, end, tokens, len(ctx.generated)), random)
