"""One generation's stream of events: :class:`Stream`."""

from __future__ import annotations

import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .errors import InferdError
from .events import Delta, Done, Event, Started, parse_event

if TYPE_CHECKING:
    from .client import Client


class Stream:
    """A ``generate`` request, sent when iteration starts; iterate it once.

    ``async for event in stream`` yields :class:`~inferd.Started`, then (with
    ``echo=True``) :class:`~inferd.Echo`, :class:`~inferd.Delta` events and finally
    :class:`~inferd.Done` (one per choice with ``n`` > 1); an ``error`` frame raises
    its :class:`~inferd.InferdError` subclass, a lost connection
    :class:`~inferd.ConnectionClosedError`.

    Leaving the loop early (``break``, an exception, a cancelled task) cancels the
    request on the daemon; leaving an ``async with stream:`` block does so at once.
    :meth:`cancel` instead lets the stream run to its ``Done`` with
    ``finish_reason == "cancelled"``.
    """

    def __init__(self, client: Client, frame: dict[str, Any]) -> None:
        self.id: str = frame["id"]
        """The request id, unique on its connection."""
        self.started: Started | None = None
        """The ``Started`` event, once received."""
        self.done: Done | None = None
        """The last ``Done`` event, once received."""
        self._client = client
        self._frame = frame
        self._choices: int = frame.get("n") or 1
        self._state = "new"  # "new" → "open" → "closed"
        self._events_ref: weakref.ref[AsyncGenerator[Event, None]] | None = None

    def __aiter__(self) -> AsyncIterator[Event]:
        events = self._events()
        self._events_ref = weakref.ref(events)
        return events

    async def _events(self) -> AsyncGenerator[Event, None]:
        if self._state == "closed":
            return
        if self._state == "open":
            raise RuntimeError(f"stream {self.id} is already being iterated")
        self._state = "open"
        ended, dones = True, 0
        try:
            queue = await self._client._open(self.id, self._frame)
            ended = False
            while not ended:
                item = await queue.get()
                if isinstance(item, InferdError):  # the connection is gone
                    ended = True
                    raise item
                ended = item.get("type") == "error"
                event = parse_event(item)  # raises for an error frame
                if isinstance(event, Started):
                    self.started = event
                elif isinstance(event, Done):
                    dones += 1
                    self.done = event
                    ended = dones == self._choices
                if event is not None:
                    yield event
        finally:
            self._state = "closed"
            self._client._forget(self.id)
            if not ended:
                await self._client._cancel(self.id)

    async def cancel(self) -> None:
        """Asks the daemon to stop this request; the stream then ends with a ``Done``
        whose ``finish_reason`` is ``"cancelled"`` (deltas in flight may come first).
        Before iteration started nothing is sent and iterating yields nothing; after
        the request ended it does nothing."""
        if self._state == "new":
            self._state = "closed"
        elif self._state == "open":
            await self._client._cancel(self.id)

    async def aclose(self) -> None:
        """Stops iterating: cancels the request on the daemon if it is still running
        and drops its remaining events. Not while another task is iterating."""
        events = self._events_ref() if self._events_ref else None
        if events is not None:
            await events.aclose()
        elif self._state == "new":
            self._state = "closed"

    async def text(self) -> str:
        """Iterates the stream and returns the concatenated text of its deltas (of
        choice 0 when ``n`` > 1)."""
        return "".join([e.text async for e in self if isinstance(e, Delta) and not e.index])

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
