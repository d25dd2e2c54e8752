"""Answers about the daemon itself: :class:`Stats` (``stats``) and :class:`Plugins`
(``plugins``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._parse import known_fields


@dataclass(frozen=True)
class PrefixCacheStats:
    """Prefix cache counters since start (see docs/protocol.md, ``stats``)."""

    enabled: bool
    disk_enabled: bool
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    memory_hit_tokens: int
    disk_hit_tokens: int
    memory_blocks: int
    memory_evictable_blocks: int
    disk_blocks: int
    disk_bytes: int
    disk_written_blocks: int
    disk_evicted_blocks: int
    disk_dropped_corrupt: int
    disk_dropped_writes: int
    disk_unreachable_writes: int


@dataclass(frozen=True)
class SpeculativeStats:
    """Speculative decoding settings and counters (``method`` is ``"off"`` and every
    other field 0 when it is off)."""

    method: str
    k: int
    row_cost: float
    draft_cost: float
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    verification_steps: int
    tokens_per_verification: float


@dataclass(frozen=True)
class Stats:
    """The engine's state when it handled the ``stats`` request."""

    running: int
    """Sequences admitted and holding KV blocks."""
    waiting: int
    preempted: int
    preemptions_total: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_block_size: int
    tokens_generated: int
    steps: int
    prompt_tokens_computed: int
    prefix_cache: PrefixCacheStats
    speculative: SpeculativeStats

    @classmethod
    def from_frame(cls, frame: dict[str, Any]) -> Stats:
        """Parses a ``stats`` frame."""
        return known_fields(
            cls,
            frame,
            prefix_cache=known_fields(PrefixCacheStats, frame["prefix_cache"]),
            speculative=known_fields(SpeculativeStats, frame["speculative"]),
        )


@dataclass(frozen=True)
class PluginInfo:
    """A Wasm plugin loaded from the daemon's ``plugins.dir``."""

    name: str
    """What a generate's ``plugins=[{"name": …}]`` uses."""
    world: str
    """``"logits-processor"`` or ``"sampler"``."""
    version: str
    description: str
    interface: str
    """The WIT package version the plugin was built against."""
    file: str


@dataclass(frozen=True)
class Plugins:
    """The daemon's loaded plugins, sorted by name, and the WIT package it implements."""

    interface: str
    plugins: list[PluginInfo]

    @classmethod
    def from_frame(cls, frame: dict[str, Any]) -> Plugins:
        """Parses a ``plugins`` frame."""
        return cls(frame["interface"], [known_fields(PluginInfo, p) for p in frame["plugins"]])
