"""Client frames as JSON text, refusing what JSON cannot carry before it is sent."""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import ValidationError


def encode_frame(frame: dict[str, Any]) -> str:
    """``frame`` as compact JSON text.

    NaN and ±infinity have no JSON form (RFC 8259 §6); Python's ``json`` would write
    them as the bare words ``NaN`` / ``Infinity``, which the daemon can only answer
    with a ``malformed JSON`` error that names no request. So they raise a
    :class:`~inferd.ValidationError` here, naming the field the way the daemon does
    (``temperature``, ``logit_bias["42"]``, ``plugins[0].config.tau``), with the frame's id.
    A value ``json`` cannot serialise at all (e.g. a set) raises its ``TypeError``.
    """
    path = _non_finite(frame, "")
    if path is not None:
        where, value = path
        raise ValidationError(f"{where} must be a finite number (got {value})", "validation", frame.get("id"))
    return json.dumps(frame, allow_nan=False, separators=(",", ":"))


def _non_finite(value: Any, where: str) -> tuple[str, float] | None:
    """The path and value of the first NaN or infinite float inside ``value``."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, value)
    if isinstance(value, dict):
        for key, item in value.items():
            found = _non_finite(item, _member(where, str(key)))
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _non_finite(item, f"{where}[{i}]")
            if found is not None:
                return found
    return None


def _member(where: str, key: str) -> str:
    """The path of ``key`` inside the object at ``where``: ``key`` at the top, then
    ``.key`` for an identifier and ``["key"]`` otherwise (as the daemon's messages)."""
    if not where:
        return key
    return f"{where}.{key}" if key.isidentifier() else f"{where}[{json.dumps(key)}]"
