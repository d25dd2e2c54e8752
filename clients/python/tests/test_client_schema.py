"""Every kind of server frame the client parses validates against docs/protocol.md's
JSON Schemas (the ``check`` fixture validates the frames of every test)."""

from __future__ import annotations

import pytest

import inferd
from client_helpers import SCHEMAS, FrameChecker, run, user
from inferd_daemon import Daemon


def test_the_protocol_doc_has_a_schema_for_each_stream_and_reply_frame() -> None:
    assert {"started", "echo", "delta", "done", "error", "tokens", "text", "stats", "plugins"} == set(SCHEMAS)


def test_every_frame_kind_validates(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            await c.complete("The sky is", max_tokens=3, echo=True, logprobs=True, top_logprobs=2).text()
            await c.chat(user("Hi"), max_tokens=3, n=2, seed=3).text()
            await c.detokenize(await c.tokenize("Hello world"))
            with pytest.raises(inferd.ValidationError):
                await c.chat(user("Hi"), top_k=-1).text()
            await c.stats()
            await c.plugins()

    run(body())
    assert set(check.seen) == set(SCHEMAS)
    assert any(f["type"] == "delta" and f.get("logprobs") for f in check.frames)
    assert any(f["type"] == "delta" and "index" in f for f in check.frames)


def test_the_checker_rejects_frames_that_break_the_schemas() -> None:
    checker = FrameChecker()
    checker({"type": "done", "id": "r1", "finish_reason": "stop", "timings": {"ttft_ms": 1, "decode_tokens_per_s": 0}})
    checker({"type": "delta", "id": "r1", "text": "a", "token_ids": [-1]})
    checker({"type": "error", "id": "r1", "error": {"type": "oops", "message": "m"}})
    checker({"type": "surprise", "id": "r1"})
    assert len(checker.failures) == 4, checker.failures
