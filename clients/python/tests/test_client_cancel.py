"""Cancelling frees the request (seen through ``stats``), and a dropped connection
fails every open stream."""

from __future__ import annotations

import asyncio

import pytest

import inferd
from client_helpers import FrameChecker, run, user, wait_idle
from inferd_daemon import Daemon

# min_tokens bans the end of the answer: only a cancel ends these before 2000 tokens.
ENDLESS = {"max_tokens": 2000, "min_tokens": 2000, "temperature": 0}


def test_stream_cancel_ends_with_a_cancelled_done_and_frees_its_blocks(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            idle = await wait_idle(c.stats)
            stream = c.chat(user("Count to one thousand."), **ENDLESS)
            deltas = 0
            async for ev in stream:
                if isinstance(ev, inferd.Delta):
                    deltas += 1
                    if deltas == 3:
                        busy = await c.stats()
                        await stream.cancel()
            assert busy.running == 1 and busy.kv_blocks_used > idle.kv_blocks_used
            assert stream.done is not None and stream.done.finish_reason == "cancelled"
            assert 3 <= stream.done.usage.completion_tokens < 100
            after = await wait_idle(c.stats)
            assert (after.running, after.kv_blocks_used) == (0, idle.kv_blocks_used)

    run(body())


def test_leaving_the_loop_cancels_the_request(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            idle = await wait_idle(c.stats)
            async for ev in c.complete("Once upon a time", **ENDLESS):
                if isinstance(ev, inferd.Delta):
                    break
            after = await wait_idle(c.stats)
            assert (after.running, after.kv_blocks_used) == (0, idle.kv_blocks_used)
            # The same with an explicit scope: the cancel is sent when it closes.
            async with c.complete("Once upon a time", **ENDLESS) as stream:
                async for ev in stream:
                    break
            after = await wait_idle(c.stats)
            assert (after.running, after.kv_blocks_used) == (0, idle.kv_blocks_used)

    run(body())


def test_a_dropped_connection_fails_every_open_stream(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        c = await inferd.connect(daemon.url, on_frame=check)
        streams = [c.complete("Once upon a time", **ENDLESS), c.chat(user("Hello"), **ENDLESS)]

        async def consume(stream: inferd.Stream) -> inferd.ConnectionClosedError:
            with pytest.raises(inferd.ConnectionClosedError) as caught:
                async for _ in stream:
                    pass
            return caught.value

        pending = asyncio.gather(*(consume(s) for s in streams))
        await asyncio.sleep(0.5)
        # A message over server.max_message_bytes (4 MiB) makes the daemon close the
        # connection with 1009, after an error frame whose id is null.
        with pytest.raises(inferd.ConnectionClosedError) as big:
            await c.tokenize("x" * (5 << 20))
        errors = await pending
        assert [e.id for e in errors] == [s.id for s in streams]
        for e in [*errors, big.value]:
            assert e.type == "connection_closed"
            assert "1009" in e.message and "max_message_bytes" in e.message, e.message
        assert c.closed
        with pytest.raises(inferd.ConnectionClosedError):
            await c.stats()
        await c.close()
        # The daemon cancelled both: nothing keeps running.
        async with inferd.connect(daemon.url) as probe:
            assert (await wait_idle(probe.stats)).running == 0

    run(body())
