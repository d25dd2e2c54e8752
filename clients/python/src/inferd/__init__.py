"""Python client for inferd's WebSocket protocol v1 (docs/protocol.md).

::

    async with inferd.connect("ws://127.0.0.1:8080/v1/ws") as c:
        async for ev in c.chat([{"role": "user", "content": "Hi"}], max_tokens=32):
            if isinstance(ev, inferd.Delta):
                print(ev.text, end="")
"""

from .client import DEFAULT_URL, Client, Connect, FrameHook, connect
from .errors import (
    AdapterInUseError,
    AuthenticationError,
    ConnectError,
    ConnectionClosedError,
    ContextLengthExceededError,
    InferdError,
    InternalError,
    ModelNotFoundError,
    OverloadedError,
    PluginTrapError,
    RequestCancelledError,
    ValidationError,
)
from .events import Delta, Done, Echo, Event, Started, Timings, TokenLogprob, ToolCallDelta, TopLogprob, Usage
from .media import image_part
from .info import EngineShare, KvEventStats, LoraStats, Model, PluginCost, PluginInfo, PluginLimits, Plugins, PrefixCacheStats, SpeculativeStats, Stats
from .stream import Stream
from .sync import SyncClient, SyncStream, connect_sync

__all__ = [
    "image_part",
    "DEFAULT_URL",
    "AdapterInUseError",
    "AuthenticationError",
    "Client",
    "Connect",
    "ConnectError",
    "ConnectionClosedError",
    "ContextLengthExceededError",
    "Delta",
    "Done",
    "Echo",
    "Event",
    "FrameHook",
    "InferdError",
    "InternalError",
    "EngineShare",
    "KvEventStats",
    "LoraStats",
    "Model",
    "ModelNotFoundError",
    "OverloadedError",
    "PluginCost",
    "PluginInfo",
    "PluginLimits",
    "PluginTrapError",
    "Plugins",
    "PrefixCacheStats",
    "RequestCancelledError",
    "SpeculativeStats",
    "Started",
    "Stats",
    "Stream",
    "SyncClient",
    "SyncStream",
    "Timings",
    "TokenLogprob",
    "ToolCallDelta",
    "TopLogprob",
    "Usage",
    "ValidationError",
    "connect",
    "connect_sync",
]
