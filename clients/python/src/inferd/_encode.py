"""Client frames as JSON text, refusing what JSON cannot carry before it is sent."""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import ValidationError


def encode_frame(frame: dict[str, Any]) -> str:
    """``frame`` as compact JSON text.

    NaN and ±infinity have no JSON form (RFC 8259 §6) and a lone surrogate has no
    UTF-8 form; Python's ``json`` would write them anyway (``NaN``, ``\\udc80``), and
    the daemon could only answer with a ``malformed JSON`` error that names no request.
    So they, and values JSON has no type for (bytes, sets, objects), raise a
    :class:`~inferd.ValidationError` here, naming the field the way the daemon does
    (``temperature``, ``logit_bias["42"]``, ``messages[0].content``), with the frame's id.
    """
    problem = _unsendable(frame, "")
    if problem is not None:
        raise ValidationError(problem, "validation", frame.get("id"))
    return json.dumps(frame, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _unsendable(value: Any, where: str) -> str | None:
    """Why the first value inside ``value`` that JSON (or the daemon's UTF-8) cannot
    carry cannot be sent, naming its path; ``None`` when everything can be."""
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} must be a finite number (got {value})"
    if isinstance(value, str):
        return _not_unicode(value, where)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where or 'the frame'} has a key {key!r} that is not a string"
            problem = _not_unicode(key, f"{where} key") or _unsendable(item, _member(where, key))
            if problem is not None:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = _unsendable(item, f"{where}[{i}]")
            if problem is not None:
                return problem
        return None
    return f"{where} must be a JSON value: string, number, boolean, null, list or dict (got {type(value).__name__})"


def _not_unicode(text: str, where: str) -> str | None:
    """A lone surrogate (e.g. from ``surrogateescape``) has no UTF-8 form."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"{where} must be valid Unicode (got a lone surrogate {text[e.start]!r} at index {e.start})"
    return None


def _member(where: str, key: str) -> str:
    """The path of ``key`` inside the object at ``where``: ``key`` at the top, then
    ``.key`` for an identifier and ``["key"]`` otherwise (as the daemon's messages)."""
    if not where:
        return key
    return f"{where}.{key}" if key.isidentifier() else f"{where}[{json.dumps(key)}]"
