"""Errors found on the client's side: values JSON cannot carry, connections that cannot
be opened, and an error the daemon could not attribute to a request."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from websockets.asyncio.server import ServerConnection, serve

import inferd
from client_helpers import FrameChecker, run, user
from inferd_daemon import Daemon

HI = user("Hi")


@pytest.mark.parametrize(
    "params, message",
    [
        ({"temperature": float("nan")}, "temperature must be a finite number (got nan)"),
        ({"top_p": float("inf")}, "top_p must be a finite number (got inf)"),
        ({"logit_bias": {"42": float("-inf")}}, 'logit_bias["42"] must be a finite number (got -inf)'),
        (
            {"plugins": [{"name": "mirostat", "config": {"tau": float("nan")}}]},
            "plugins[0].config.tau must be a finite number (got nan)",
        ),
        ({"stop": ["ok", "x\udc80y"]}, "stop[1] must be valid Unicode (got a lone surrogate '\\udc80' at index 1)"),
        ({"stop": b"END"}, "stop must be a JSON value: string, number, boolean, null, list or dict (got bytes)"),
    ],
)
def test_non_finite_numbers_are_refused_before_sending(
    daemon: Daemon, check: FrameChecker, params: dict[str, object], message: str
) -> None:
    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            stream = c.chat(HI, max_tokens=4, **params)
            with pytest.raises(inferd.ValidationError) as caught:
                await asyncio.wait_for(stream.text(), timeout=10)
            assert (caught.value.message, caught.value.type, caught.value.id) == (message, "validation", stream.id)
            # Nothing reached the daemon, and the connection goes on.
            assert check.frames == []
            assert await c.tokenize("Paris") == [38634]
            assert (await c.stats()).running == 0

    run(body())


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_connection_that_cannot_be_opened_raises_connect_error(daemon: Daemon) -> None:
    port = free_port()
    cases = [
        (f"ws://127.0.0.1:{port}/v1/ws", f"cannot connect to ws://127.0.0.1:{port}/v1/ws: "),
        ("http://127.0.0.1:8080/v1/ws", "cannot connect to http://127.0.0.1:8080/v1/ws: "),
        ("ws://127.0.0.1:99999/v1/ws", "cannot connect to ws://127.0.0.1:99999/v1/ws: Port out of range"),
        ("ws://[::1/v1/ws", "cannot connect to ws://[::1/v1/ws: "),
        (
            f"ws://{daemon.addr}/v1/nope",
            f"cannot connect to ws://{daemon.addr}/v1/nope: the daemon answered HTTP 404 "
            "instead of a WebSocket upgrade (is the path /v1/ws?)",
        ),
    ]

    async def body() -> None:
        for url, prefix in cases:
            with pytest.raises(inferd.ConnectError) as caught:
                await inferd.connect(url)
            assert caught.value.message.startswith(prefix), caught.value.message
            assert (caught.value.type, caught.value.id) == ("connect_failed", None)
            assert caught.value.__cause__ is not None

        with pytest.raises(inferd.ConnectError, match=r"^cannot connect to 123: the URL must be a string like ws://"):
            await inferd.connect(123)  # type: ignore[arg-type]

    run(body())
    with pytest.raises(inferd.ConnectError, match=f"^cannot connect to ws://127.0.0.1:{port}/v1/ws: "):
        inferd.connect_sync(f"ws://127.0.0.1:{port}/v1/ws")


def test_an_error_with_id_null_closes_the_connection_instead_of_hanging() -> None:
    """A server that answers a frame with an unattributable error and stays open: the
    request the answer was meant for must not wait forever."""

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            assert json.loads(message)["type"] == "generate"
            error = {"type": "validation", "message": "malformed JSON: expected value at line 1 column 9"}
            await ws.send(json.dumps({"type": "error", "id": None, "error": error}))

    async def body() -> None:
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            async with inferd.connect(f"ws://127.0.0.1:{port}/v1/ws") as c:
                with pytest.raises(inferd.ConnectionClosedError) as caught:
                    await asyncio.wait_for(c.chat(HI).text(), timeout=10)
                assert caught.value.message.startswith(
                    "closed by the client after an error the daemon could not attribute to a request"
                ), caught.value.message
                assert "malformed JSON: expected value at line 1 column 9" in caught.value.message
                assert c.closed
                with pytest.raises(inferd.ConnectionClosedError):
                    await c.tokenize("Paris")

    run(body())
