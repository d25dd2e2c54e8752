"""The asyncio client: :func:`connect` opens a :class:`Client` on one WebSocket, which
carries any number of concurrent requests."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from . import _http
from ._encode import encode_frame
from .errors import AuthenticationError, ConnectError, ConnectionClosedError, InferdError, error_from_frame
from .info import Model, Plugins, Stats
from .stream import Stream

DEFAULT_URL = "ws://127.0.0.1:8080/v1/ws"
"""The daemon's default WebSocket endpoint."""

FrameHook = Callable[[dict[str, Any]], None]
"""Called with every server frame, parsed from JSON, before it is dispatched."""

_Item = dict[str, Any] | InferdError

ORPHAN_GRACE_S = 1.0
"""Seconds the client waits for the daemon to close the connection after an ``error``
frame with ``id`` null before closing it itself."""


class Client:
    """An open connection to the daemon. Get one from :func:`connect`.

    Requests run concurrently on it (e.g. several streams under ``asyncio.gather``);
    the client picks each request's id. When the connection is lost every open
    request raises :class:`~inferd.ConnectionClosedError`, and so does every later
    call: reconnecting is the caller's choice.

    :meth:`models`, :meth:`load_adapter` and :meth:`unload_adapter` are HTTP calls to
    the daemon's ``/v1/`` endpoints beside the WebSocket URL, with the same API key.
    """

    def __init__(
        self,
        ws: ClientConnection,
        on_frame: FrameHook | None = None,
        *,
        url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self._ws = ws
        self._on_frame = on_frame
        self._url = url
        self._api_key = api_key
        self._ids = itertools.count(1)
        self._routes: dict[str, asyncio.Queue[_Item]] = {}
        self._closed_reason: str | None = None
        self._closing = False
        self._closing_by_user = False
        self._orphan_timer: asyncio.TimerHandle | None = None
        self._closer: asyncio.Task[None] | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (by either side)."""
        return self._closed_reason is not None

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        adapter: str | None = None,
        lora_scale: float | None = None,
        **params: Any,
    ) -> Stream:
        """A chat generation: ``messages`` are ``{"role": …, "content": …}`` dicts,
        rendered with the model's chat template.

        ``adapter`` names a LoRA adapter the daemon serves (see :meth:`models`) to
        generate with instead of the base model alone; ``lora_scale`` scales its delta
        (the daemon's default 1, within [-16, 16]; only with an adapter). An adapter
        the daemon does not serve raises :class:`~inferd.ModelNotFoundError`.

        ``params`` are the ``generate`` frame's other fields (``max_tokens``,
        ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``,
        ``plugins``, ``logprobs``, ``n``, …; see docs/protocol.md), sent as given and
        validated by the daemon; ``None`` values are left out. The request is sent
        when iteration starts.
        """
        return Stream(
            self, self._generate_frame(messages=messages, adapter=adapter, lora_scale=lora_scale, **params)
        )

    def complete(
        self,
        prompt: str | list[int],
        *,
        adapter: str | None = None,
        lora_scale: float | None = None,
        **params: Any,
    ) -> Stream:
        """A raw completion of ``prompt`` (text, or token ids used unchanged); the
        parameters are :meth:`chat`'s (plus ``echo``)."""
        return Stream(self, self._generate_frame(prompt=prompt, adapter=adapter, lora_scale=lora_scale, **params))

    async def tokenize(self, text: str, special: bool = False) -> list[int]:
        """``text``'s token ids, without BOS or chat template; with ``special`` the text
        of special tokens maps to their control ids."""
        frame = await self._call({"type": "tokenize", "text": text, "special": special})
        return list(frame["token_ids"])

    async def detokenize(self, token_ids: list[int]) -> str:
        """The text of ``token_ids`` (each below the vocabulary size)."""
        frame = await self._call({"type": "detokenize", "token_ids": list(token_ids)})
        return str(frame["text"])

    async def stats(self) -> Stats:
        """The engine's counters (running and waiting sequences, KV blocks, caches)."""
        return Stats.from_frame(await self._call({"type": "stats"}))

    async def plugins(self) -> Plugins:
        """The Wasm plugins the daemon loaded."""
        return Plugins.from_frame(await self._call({"type": "plugins"}))

    async def models(self) -> list[Model]:
        """The base model (first) and the LoRA adapters the daemon serves
        (``GET /v1/models``); an adapter's :attr:`~inferd.Model.id` is what
        ``adapter=`` takes."""
        body = json.loads(await self._http("GET", "models"))
        return [Model.from_json(m) for m in body["data"]]

    async def load_adapter(self, name: str, path: str | os.PathLike[str]) -> None:
        """Loads the LoRA adapter at ``path`` (a GGUF adapter or a PEFT directory on
        the daemon's machine) as ``name`` (``POST /v1/load_lora_adapter``); requests
        may use ``adapter=name`` from then on. A file that does not load or fit the
        base model, or a name already loaded, raises :class:`~inferd.ValidationError`."""
        await self._http("POST", "load_lora_adapter", {"lora_name": name, "lora_path": os.fspath(path)})

    async def unload_adapter(self, name: str) -> None:
        """Unloads the LoRA adapter ``name`` (``POST /v1/unload_lora_adapter``). An
        unknown name raises :class:`~inferd.ModelNotFoundError`; an adapter requests
        are generating with raises :class:`~inferd.AdapterInUseError` (retry when they
        end)."""
        await self._http("POST", "unload_lora_adapter", {"lora_name": name})

    async def close(self) -> None:
        """Closes the connection, which cancels its open requests (their streams raise
        :class:`~inferd.ConnectionClosedError`)."""
        self._closing = self._closing_by_user = True
        await self._ws.close()
        await self._reader

    async def _http(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        """An HTTP call to ``/v1/<path>`` beside the WebSocket; like every call, refused
        once the connection is closed."""
        if self._closed_reason is not None:
            raise ConnectionClosedError(self._closed_reason, "connection_closed")
        if self._url is None:
            raise ConnectError("this client was made without its URL, so it has no HTTP endpoint")
        return await _http.call(self._url, self._api_key, method, path, body)

    def _generate_frame(self, **fields: Any) -> dict[str, Any]:
        for reserved in ("type", "id"):
            if reserved in fields:
                raise TypeError(f"{reserved!r} is set by the client, not a generate parameter")
        frame: dict[str, Any] = {"type": "generate", "id": f"r{next(self._ids)}"}
        frame.update((k, v) for k, v in fields.items() if v is not None)
        return frame

    async def _call(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Sends a frame that gets exactly one answer and returns that answer."""
        rid = f"r{next(self._ids)}"
        queue = await self._open(rid, {**frame, "id": rid})
        try:
            item = await queue.get()
        finally:
            self._forget(rid)
        if isinstance(item, InferdError):
            raise item
        if item.get("type") == "error":
            raise error_from_frame(item)
        return item

    async def _open(self, rid: str, frame: dict[str, Any]) -> asyncio.Queue[_Item]:
        """Routes the frames about ``rid`` to a new queue, then sends ``frame``."""
        if self._closed_reason is not None:
            raise ConnectionClosedError(self._closed_reason, "connection_closed", rid)
        text = encode_frame(frame)  # raises for NaN / infinity before anything is sent
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._routes[rid] = queue
        try:
            await self._ws.send(text)
        except ConnectionClosed as exc:
            self._forget(rid)
            await self._reader  # ends with the connection, knowing why it closed
            raise ConnectionClosedError(str(self._closed_reason), "connection_closed", rid) from exc
        return queue

    def _close_unattributable(self) -> None:
        """Closes the connection after an error with ``id`` null (see :meth:`_read`)."""
        if not self._closing:
            self._closing = True
            self._closer = asyncio.ensure_future(self._ws.close())

    def _forget(self, rid: str) -> None:
        """Drops ``rid``'s route: its later frames are ignored."""
        self._routes.pop(rid, None)

    async def _cancel(self, rid: str) -> None:
        """Sends ``cancel`` for ``rid`` unless the connection is gone (which cancelled it)."""
        if self._closed_reason is None:
            try:
                await self._ws.send(encode_frame({"type": "cancel", "id": rid}))
            except ConnectionClosed:
                pass

    async def _read(self) -> None:
        """Dispatches every server frame to its request's queue until the connection
        ends, then fails the requests still open.

        An ``error`` frame with ``id`` null answers a client frame the daemon could not
        attribute (too large, or not valid JSON). Some open request then never gets
        its answer, and the client cannot tell which, so rather than leave it waiting
        forever the client closes the connection unless the daemon does so within
        :data:`ORPHAN_GRACE_S` (as it does after a too-large frame, with code 1009):
        every open request raises :class:`~inferd.ConnectionClosedError` naming the
        daemon's error.
        """
        orphan: dict[str, Any] | None = None  # the error frame with id null
        reason = "closed by the client"
        try:
            async for message in self._ws:
                frame = json.loads(message)
                if self._on_frame is not None:
                    self._on_frame(frame)
                rid = frame.get("id")
                queue = self._routes.get(rid) if isinstance(rid, str) else None
                if queue is not None:
                    queue.put_nowait(frame)
                elif frame.get("type") == "error" and rid is None:
                    orphan = frame
                    if self._orphan_timer is None:  # the daemon may be closing already
                        self._orphan_timer = asyncio.get_running_loop().call_later(
                            ORPHAN_GRACE_S, self._close_unattributable
                        )
            if self._orphan_timer is not None and self._closing and not self._closing_by_user:
                reason = "closed by the client after an error the daemon could not attribute to a request"
            elif not self._closing:
                reason = f"closed by the daemon (code {self._ws.close_code}: {self._ws.close_reason!r})"
        except ConnectionClosed as exc:
            reason = f"connection lost: {exc}"
        except Exception as exc:  # an unreadable frame, or on_frame raised
            reason = f"connection dropped after {type(exc).__name__}: {exc}"
            await self._ws.close()
        finally:
            if self._orphan_timer is not None:
                self._orphan_timer.cancel()
            if orphan is not None:
                reason += f"; the daemon's last error: {error_from_frame(orphan)!r}"
            self._closed_reason = reason
            for rid, queue in self._routes.items():
                queue.put_nowait(ConnectionClosedError(reason, "connection_closed", rid))
            self._routes.clear()


class Connect:
    """What :func:`connect` returns: ``await`` it for a :class:`Client`, or use it as
    ``async with connect(…) as client:``, which closes the client at the end."""

    def __init__(self, url: str, api_key: str | None, on_frame: FrameHook | None, open_timeout: float) -> None:
        self._url = url
        self._api_key = api_key
        self._on_frame = on_frame
        self._open_timeout = open_timeout
        self._client: Client | None = None

    def __await__(self) -> Generator[Any, None, Client]:
        return self._open().__await__()

    async def __aenter__(self) -> Client:
        self._client = await self._open()
        return self._client

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._client is not None:
            await self._client.close()

    async def _open(self) -> Client:
        if not isinstance(self._url, str):
            raise ConnectError(f"cannot connect to {self._url!r}: the URL must be a string like {DEFAULT_URL}")
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key is not None else None
        try:
            # Frames are as large as the requests the caller makes (e.g. echoed
            # logprobs of a long prompt), so no size limit of our own.
            ws = await ws_connect(
                self._url, additional_headers=headers, max_size=None, open_timeout=self._open_timeout
            )
        except InvalidStatus as exc:
            if exc.response.status_code == 401:
                raise _authentication_error(exc.response.body) from exc
            raise ConnectError(
                f"cannot connect to {self._url}: the daemon answered HTTP {exc.response.status_code} "
                "instead of a WebSocket upgrade (is the path /v1/ws?)"
            ) from exc
        except (OSError, WebSocketException, asyncio.TimeoutError, ValueError) as exc:
            # ValueError: a port out of range or not a number, a malformed IPv6 host.
            detail = str(exc) or type(exc).__name__
            raise ConnectError(f"cannot connect to {self._url}: {detail}") from exc
        return Client(ws, self._on_frame, url=self._url, api_key=self._api_key)


def connect(
    url: str = DEFAULT_URL,
    *,
    api_key: str | None = None,
    on_frame: FrameHook | None = None,
    open_timeout: float = 10.0,
) -> Connect:
    """Connects to the daemon at ``url`` (``ws://HOST:PORT/v1/ws``).

    ``api_key`` is sent as ``Authorization: Bearer …``; a daemon that refuses it
    raises :class:`~inferd.AuthenticationError`. ``on_frame`` sees every server frame
    (e.g. to log or check it); an exception it raises drops the connection. A
    malformed URL, a daemon that cannot be reached, a handshake that fails or times
    out after ``open_timeout`` seconds raise :class:`~inferd.ConnectError` (the
    original exception is its ``__cause__``).
    """
    return Connect(url, api_key, on_frame, open_timeout)


def _authentication_error(body: bytes | bytearray | None) -> AuthenticationError:
    """The exception for the daemon's HTTP 401 body ``{"error": {"code", "message"}}``."""
    try:
        error = json.loads(body or b"")["error"]
        return AuthenticationError(str(error["message"]), str(error["code"]))
    except (ValueError, KeyError, TypeError):
        return AuthenticationError("HTTP 401: the daemon refused the API key", "invalid_api_key")
