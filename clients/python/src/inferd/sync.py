"""The blocking client: :class:`SyncClient` runs an asyncio :class:`~inferd.Client` on
an event loop in a background thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import threading
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from .client import DEFAULT_URL, Client, FrameHook, connect
from .events import Delta, Done, Event, Started
from .info import Model, Plugins, Stats
from .stream import Stream

T = TypeVar("T")

_END = object()


class _LoopThread:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="inferd-client", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs ``coro`` on the loop and waits for its result; an interrupt (Ctrl-C)
        while waiting cancels it."""
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class SyncStream:
    """A generation for blocking code: iterate it once for its events (see
    :class:`~inferd.Stream`). Leaving the loop early cancels the request."""

    def __init__(self, runner: _LoopThread, stream: Stream) -> None:
        self._runner = runner
        self._stream = stream

    @property
    def id(self) -> str:
        """The request id."""
        return self._stream.id

    @property
    def started(self) -> Started | None:
        """The ``Started`` event, once received."""
        return self._stream.started

    @property
    def done(self) -> Done | None:
        """The last ``Done`` event, once received."""
        return self._stream.done

    def __iter__(self) -> Iterator[Event]:
        events: queue.Queue[Any] = queue.Queue()
        pump = self._runner.submit(self._pump(events))
        try:
            while (item := events.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            pump.cancel()  # cancels the request if it is still running

    async def _pump(self, out: queue.Queue[Any]) -> None:
        try:
            async for event in self._stream:
                out.put(event)
            out.put(_END)
        except Exception as exc:
            out.put(exc)

    def cancel(self) -> None:
        """Asks the daemon to stop the request; iteration goes on to its ``Done``
        with ``finish_reason == "cancelled"``."""
        self._runner.run(self._stream.cancel())

    def text(self) -> str:
        """Iterates the stream and returns its deltas' text (of choice 0 when
        ``n`` > 1)."""
        return "".join(e.text for e in self if isinstance(e, Delta) and not e.index)


class SyncClient:
    """A blocking client with the methods of :class:`~inferd.Client`; use it as a
    context manager or call :meth:`close`. ``on_frame`` runs on the background thread."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        on_frame: FrameHook | None = None,
        open_timeout: float = 10.0,
    ) -> None:
        self._runner = _LoopThread()
        try:
            self._client = self._runner.run(_open(url, api_key, on_frame, open_timeout))
        except BaseException:
            self._runner.stop()
            raise
        self._stopped = False

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        adapter: str | None = None,
        lora_scale: float | None = None,
        **params: Any,
    ) -> SyncStream:
        """See :meth:`inferd.Client.chat`."""
        return SyncStream(
            self._runner, self._client.chat(messages, adapter=adapter, lora_scale=lora_scale, **params)
        )

    def complete(
        self,
        prompt: str | list[int],
        *,
        adapter: str | None = None,
        lora_scale: float | None = None,
        **params: Any,
    ) -> SyncStream:
        """See :meth:`inferd.Client.complete`."""
        return SyncStream(
            self._runner, self._client.complete(prompt, adapter=adapter, lora_scale=lora_scale, **params)
        )

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """See :meth:`inferd.Client.tokenize`."""
        return self._runner.run(self._client.tokenize(text, special))

    def detokenize(self, token_ids: list[int]) -> str:
        """See :meth:`inferd.Client.detokenize`."""
        return self._runner.run(self._client.detokenize(token_ids))

    def stats(self) -> Stats:
        """See :meth:`inferd.Client.stats`."""
        return self._runner.run(self._client.stats())

    def plugins(self) -> Plugins:
        """See :meth:`inferd.Client.plugins`."""
        return self._runner.run(self._client.plugins())

    def models(self) -> list[Model]:
        """See :meth:`inferd.Client.models`."""
        return self._runner.run(self._client.models())

    def load_adapter(self, name: str, path: str | os.PathLike[str]) -> None:
        """See :meth:`inferd.Client.load_adapter`."""
        self._runner.run(self._client.load_adapter(name, path))

    def unload_adapter(self, name: str) -> None:
        """See :meth:`inferd.Client.unload_adapter`."""
        self._runner.run(self._client.unload_adapter(name))

    @property
    def closed(self) -> bool:
        """Whether the connection is closed."""
        return self._client.closed

    def close(self) -> None:
        """Closes the connection and stops the background thread."""
        if not self._stopped:
            self._stopped = True
            try:
                self._runner.run(self._client.close())
            finally:
                self._runner.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


async def _open(url: str, api_key: str | None, on_frame: FrameHook | None, open_timeout: float) -> Client:
    return await connect(url, api_key=api_key, on_frame=on_frame, open_timeout=open_timeout)


def connect_sync(
    url: str = DEFAULT_URL,
    *,
    api_key: str | None = None,
    on_frame: FrameHook | None = None,
    open_timeout: float = 10.0,
) -> SyncClient:
    """Connects like :func:`inferd.connect`, for blocking code."""
    return SyncClient(url, api_key=api_key, on_frame=on_frame, open_timeout=open_timeout)
