"""The events of a generation stream: :class:`Started`, :class:`Echo`, :class:`Delta`,
:class:`Done` (protocol v1 frames of the same names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._parse import known_fields
from .errors import error_from_frame


@dataclass(frozen=True)
class TopLogprob:
    """One alternative at a position: a token and its log-probability."""

    token_id: int
    token: str
    """The token's bytes as UTF-8, invalid sequences replaced."""
    bytes: list[int]
    """The token's exact bytes."""
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model's raw logits, with the most likely
    alternatives (``logprobs`` / ``top_logprobs`` of a generate)."""

    token_id: int
    token: str
    bytes: list[int]
    logprob: float | None
    """``None`` only for an echoed prompt's first token (it has no context)."""
    top_logprobs: list[TopLogprob] = field(default_factory=list)

    @classmethod
    def from_frame(cls, data: dict[str, Any]) -> TokenLogprob:
        """Parses one entry of a frame's ``logprobs``."""
        top = [known_fields(TopLogprob, t) for t in data.get("top_logprobs") or []]
        return known_fields(cls, data, top_logprobs=top)


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call: the first piece of call ``index`` has its ``id`` and
    ``name``, the following ones parts of its ``arguments`` JSON text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Started:
    """The prompt was tokenized and admitted."""

    id: str
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens served from the prefix cache."""


@dataclass(frozen=True)
class Echo:
    """The prompt sent back (``echo=True``), before any delta."""

    id: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True)
class Delta:
    """New output: ``text`` (whole characters, possibly empty) and the token ids
    sampled since the previous delta."""

    id: str
    text: str
    token_ids: list[int]
    index: int | None = None
    """The choice, only when ``n`` > 1."""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True)
class Usage:
    """Token counts of a finished request (or choice)."""

    prompt_tokens: int
    completion_tokens: int
    """Every generated token, a final end-of-turn token included."""
    cached_tokens: int
    draft_tokens: int
    accepted_draft_tokens: int
    image_tokens: int = 0
    """Prompt tokens that are image placeholders (vision-language models)."""


@dataclass(frozen=True)
class Timings:
    """Latency and speed of a finished request (or choice)."""

    ttft_ms: float
    """From acceptance to the first sampled token."""
    decode_tokens_per_s: float


@dataclass(frozen=True)
class Done:
    """The request (or, with ``n`` > 1, choice ``index``) ended."""

    id: str
    finish_reason: str
    """``"stop"``, ``"length"``, ``"tool_calls"`` or ``"cancelled"``."""
    usage: Usage
    timings: Timings
    index: int | None = None


Event = Started | Echo | Delta | Done
"""Anything a generation stream yields."""


def _logprobs(data: dict[str, Any]) -> list[TokenLogprob] | None:
    entries = data.get("logprobs")
    return None if entries is None else [TokenLogprob.from_frame(e) for e in entries]


def parse_event(frame: dict[str, Any]) -> Event | None:
    """The event of a generation's server frame; raises the frame's exception for an
    ``error`` frame; ``None`` for a frame type this version does not know."""
    kind = frame.get("type")
    if kind == "started":
        return known_fields(Started, frame)
    if kind == "echo":
        return known_fields(Echo, frame, logprobs=_logprobs(frame))
    if kind == "delta":
        calls = [known_fields(ToolCallDelta, c) for c in frame.get("tool_calls") or []]
        return known_fields(Delta, frame, tool_calls=calls, logprobs=_logprobs(frame))
    if kind == "done":
        usage = known_fields(Usage, frame["usage"])
        timings = known_fields(Timings, frame["timings"])
        return known_fields(Done, frame, usage=usage, timings=timings)
    if kind == "error":
        raise error_from_frame(frame)
    return None
