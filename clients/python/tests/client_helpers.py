"""Helpers of the client's tests: the frame checker that validates every server frame
the client parses against the JSON Schemas of docs/protocol.md, and small utilities."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import jsonschema

ROOT = Path(__file__).resolve().parents[3]
T = TypeVar("T")

SERVER_SCHEMA_PREFIX = "https://inferd.dev/schemas/v1/server/"
API_KEY = "secret"
SMALL_CONTEXT = 40
"""The limited daemon's context window (``model.context_length``)."""
MAX_WAITING = 1
"""The limited daemon's ``scheduler.max_waiting`` (with ``max_running`` 1)."""
ADAPTER = "sql"
"""The LoRA adapter the lora daemon serves (``smollm2-lora-f16.gguf``)."""


def lora_file(name: str) -> Path:
    """A LoRA adapter for the default model made by ``scripts/lora-gguf.sh files``, in
    ``$INFERD_LORA_DIR`` (default ``~/.cache/inferd/lora``)."""
    path = Path(os.environ.get("INFERD_LORA_DIR", Path.home() / ".cache" / "inferd" / "lora")) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run scripts/lora-gguf.sh files")
    return path


def server_schemas() -> dict[str, dict[str, Any]]:
    """The server frames' schemas in docs/protocol.md, by frame type (their title)."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    schemas = {}
    for block in re.findall(r"```json\n(.*?)\n```", text, re.S):
        if f'"$id": "{SERVER_SCHEMA_PREFIX}' in block:
            schema = json.loads(block)
            jsonschema.Draft202012Validator.check_schema(schema)
            schemas[schema["title"]] = schema
    return schemas


SCHEMAS = server_schemas()


class FrameChecker:
    """An ``on_frame`` hook: validates each frame and records its type and any
    failure (the hook never raises, so the client keeps working)."""

    def __init__(self) -> None:
        self.validators = {t: jsonschema.Draft202012Validator(s) for t, s in SCHEMAS.items()}
        self.seen: dict[str, int] = {}
        self.failures: list[str] = []
        self.frames: list[dict[str, Any]] = []

    def __call__(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        self.frames.append(frame)
        self.seen[str(kind)] = self.seen.get(str(kind), 0) + 1
        validator = self.validators.get(str(kind))
        if validator is not None:
            self.failures += [f"{e.message} at {list(e.path)} in {frame}" for e in validator.iter_errors(frame)]
        else:
            self.failures.append(f"frame type {kind!r} has no schema: {frame}")


def run(coro: Awaitable[T]) -> T:
    """Runs a test's coroutine on a fresh event loop (with a generous bound)."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout=120)

    return asyncio.run(bounded())


def user(text: str) -> list[dict[str, Any]]:
    """A one-message chat."""
    return [{"role": "user", "content": text}]


async def wait_idle(stats: Callable[[], Awaitable[Any]], timeout: float = 5.0) -> Any:
    """Polls ``stats`` until nothing runs or waits; returns the last stats."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        st = await stats()
        if (st.running, st.waiting) == (0, 0) or loop.time() > deadline:
            return st
        await asyncio.sleep(0.05)
