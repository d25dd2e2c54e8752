"""Answers about the daemon itself: :class:`Stats` (``stats``), :class:`Plugins`
(``plugins``) and :class:`Model` (``GET /v1/models``)."""

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
class LoraStats:
    """The LoRA adapters the engine's sequences use now, sorted, each once."""

    running: list[str]
    waiting: list[str]


@dataclass(frozen=True)
class KvEventStats:
    """KV-cache event messages since start (``[kv_events]``; 0 when off)."""

    published: int
    """Sent on the ZeroMQ PUB socket."""
    dropped: int
    """Pushed out of the replay buffer before they could be sent."""


@dataclass(frozen=True)
class EngineShare:
    """One engine's share of the daemon's state (``[[engines]]``)."""

    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    placed: int
    """Requests placed on the engine since start."""
    prefix_hit_tokens: int
    """Prompt tokens it served from its prefix cache since start."""


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
    lora: LoraStats | None = None
    """The adapters in use (``None`` from a daemon without LoRA support)."""
    kv_events: KvEventStats | None = None
    """KV-cache event counters (``None`` from a daemon without them)."""
    engines: list[EngineShare] | None = None
    """Each engine's share, in order (``None`` from a daemon without them)."""

    @classmethod
    def from_frame(cls, frame: dict[str, Any]) -> Stats:
        """Parses a ``stats`` frame."""
        lora = frame.get("lora")
        kv_events = frame.get("kv_events")
        engines = frame.get("engines")
        return known_fields(
            cls,
            frame,
            prefix_cache=known_fields(PrefixCacheStats, frame["prefix_cache"]),
            speculative=known_fields(SpeculativeStats, frame["speculative"]),
            lora=known_fields(LoraStats, lora) if isinstance(lora, dict) else None,
            kv_events=known_fields(KvEventStats, kv_events) if isinstance(kv_events, dict) else None,
            engines=[known_fields(EngineShare, e) for e in engines] if isinstance(engines, list) else None,
        )


@dataclass(frozen=True)
class PluginInfo:
    """A Wasm plugin loaded from the daemon's ``plugins.dir``."""

    name: str
    """What a generate's ``plugins=[{"name": …}]`` uses."""
    world: str
    """``"logits-processor"``, ``"context-processor"`` or ``"sampler"``."""
    version: str
    description: str
    interface: str
    """The WIT package version the plugin was built against."""
    file: str
    limits: PluginLimits | None = None
    """The sandbox limits its instances run under (``None`` from an older daemon)."""
    cost: PluginCost | None = None
    """What it has cost since the daemon started (``None`` from an older daemon)."""


@dataclass(frozen=True)
class PluginLimits:
    """A plugin's sandbox limits: ``[plugins]`` or its own ``[plugins.limits.NAME]``."""

    call_deadline_ms: float
    configure_deadline_ms: float
    memory_bytes: int
    instances: int


@dataclass(frozen=True)
class PluginCost:
    """A plugin's measured cost since start-up."""

    instantiations: int
    instantiate_ms_mean: float
    calls: int
    call_us_mean: float
    """Mean wall-clock time of one ``process`` / ``sample`` call, microseconds."""
    memory_bytes_peak: int


def _plugin(data: dict[str, Any]) -> PluginInfo:
    limits, cost = data.get("limits"), data.get("cost")
    return known_fields(
        PluginInfo,
        data,
        limits=known_fields(PluginLimits, limits) if isinstance(limits, dict) else None,
        cost=known_fields(PluginCost, cost) if isinstance(cost, dict) else None,
    )


@dataclass(frozen=True)
class Plugins:
    """The daemon's loaded plugins, sorted by name, and the WIT package it implements."""

    interface: str
    plugins: list[PluginInfo]

    @classmethod
    def from_frame(cls, frame: dict[str, Any]) -> Plugins:
        """Parses a ``plugins`` frame."""
        return cls(frame["interface"], [_plugin(p) for p in frame["plugins"]])


@dataclass(frozen=True)
class Model:
    """One entry of ``GET /v1/models``: the base model, listed first, or a LoRA adapter
    served over it."""

    id: str
    """The name: an adapter's is what ``adapter=`` takes (and an OpenAI ``model``)."""
    created: int
    """When the base model was loaded, Unix seconds."""
    owned_by: str
    root: str
    """The base model's id, or the adapter's file or directory."""
    parent: str | None
    """``None`` for the base model; the base model's id for an adapter."""

    @property
    def is_adapter(self) -> bool:
        """Whether this is a LoRA adapter (not the base model)."""
        return self.parent is not None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Model:
        """Parses one ``data`` entry of ``/v1/models``."""
        return known_fields(cls, data)
