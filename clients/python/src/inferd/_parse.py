"""Builds the typed dataclasses from server frames, ignoring fields this version does
not know (the protocol allows servers to add some)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def known_fields(cls: type[T], data: dict[str, Any], **overrides: Any) -> T:
    """``cls(**data)`` restricted to ``cls``'s fields, with ``overrides`` replacing
    (already parsed) values."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in data.items() if k in names}
    values.update(overrides)
    return cls(**values)
