"""The daemon's HTTP endpoints beside the WebSocket (``/v1/models``, the LoRA adapter
load and unload), with the standard library: ``urllib`` in a worker thread."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .errors import ConnectError, error_from_http

TIMEOUT_S = 60.0
"""Seconds an HTTP call may take (loading a large adapter takes a few)."""


def http_base(ws_url: str) -> str | None:
    """The ``/v1/`` HTTP base beside the WebSocket ``ws_url``: ``ws://HOST:PORT/v1/ws``
    gives ``http://HOST:PORT/v1/`` (``wss`` gives ``https``); ``None`` when the URL's
    path does not end in ``/ws``."""
    parts = urllib.parse.urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme.lower())
    if scheme is None or not parts.netloc or not parts.path.endswith("/ws"):
        return None
    return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path[: -len("ws")], "", ""))


def _request(method: str, url: str, api_key: str | None, body: dict[str, Any] | None) -> bytes:
    headers = {"Accept": "application/json", "User-Agent": "inferd-python"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None
    if body is not None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as exc:
        raise error_from_http(exc.code, exc.read(), url) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ConnectError(f"cannot reach {url}: {reason}") from exc


async def call(
    ws_url: str, api_key: str | None, method: str, path: str, body: dict[str, Any] | None = None
) -> bytes:
    """Sends ``method`` ``/v1/<path>`` beside ``ws_url`` and returns the body of a 2xx
    answer; an error answer raises its :class:`~inferd.InferdError` subclass, a daemon
    that cannot be reached :class:`~inferd.ConnectError`."""
    base = http_base(ws_url)
    if base is None:
        raise ConnectError(
            f"no HTTP endpoint beside {ws_url}: the WebSocket URL's path must end in /ws (as /v1/ws does)"
        )
    return await asyncio.to_thread(_request, method, base + path, api_key, body)
