"""The blocking wrapper: the same answers as the asyncio client, cancel on leaving the
loop, errors raised in the caller's thread."""

from __future__ import annotations

import time

import pytest

import inferd
from client_helpers import FrameChecker, user
from inferd_daemon import Daemon


def wait_idle(c: inferd.SyncClient, timeout: float = 5.0) -> inferd.Stats:
    """Polls ``stats`` until nothing runs or waits; returns the last stats."""
    deadline = time.monotonic() + timeout
    while (st := c.stats()).running + st.waiting and time.monotonic() < deadline:
        time.sleep(0.05)
    return st


def test_sync_client_streams_cancels_and_raises(daemon: Daemon, check: FrameChecker) -> None:
    with inferd.connect_sync(daemon.url, on_frame=check) as c:
        events = list(c.complete("Once upon a time", max_tokens=8, temperature=0))
        assert [type(e) for e in events[:2]] == [inferd.Started, inferd.Delta]
        ids = [i for e in events if isinstance(e, inferd.Delta) for i in e.token_ids]
        assert ids[:4] == [28, 260, 2240, 282]  # llama.cpp's greedy tokens (tests/tests/bad_input.rs)
        assert c.detokenize(ids) == c.complete("Once upon a time", max_tokens=8, temperature=0).text()
        assert c.tokenize("The sky is") == [504, 6376, 314]

        idle = wait_idle(c)
        for ev in c.chat(user("Count to one thousand."), max_tokens=2000, min_tokens=2000):
            if isinstance(ev, inferd.Delta):
                break
        after = wait_idle(c)
        assert (after.running, after.kv_blocks_used) == (0, idle.kv_blocks_used)

        stream = c.complete("Once upon a time", max_tokens=2000, min_tokens=2000)
        for ev in stream:
            if isinstance(ev, inferd.Started):
                stream.cancel()
        assert stream.done is not None and stream.done.finish_reason == "cancelled"

        with pytest.raises(inferd.ValidationError, match=r"^top_p must be in \(0, 1\] \(got 1.5\)$"):
            c.chat(user("Hi"), top_p=1.5).text()
        assert {p.name for p in c.plugins().plugins} >= {"noop"}
    assert c.closed
