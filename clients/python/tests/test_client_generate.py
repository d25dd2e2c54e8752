"""Generation through the asyncio client: the same text as inferd-cli, concurrent
streams on one connection, echo with logprobs, several choices."""

from __future__ import annotations

import asyncio
import subprocess

import inferd
from client_helpers import FrameChecker, run, user
from inferd_daemon import Daemon, binary

QUESTION = "What is the capital of France? Answer in one short sentence."


async def greedy(c: inferd.Client, question: str, max_tokens: int) -> tuple[str, list[int], inferd.Done]:
    """A greedy chat's text, token ids and ``Done``, from its typed events."""
    text, ids, done = "", [], None
    async for ev in c.chat(user(question), temperature=0, max_tokens=max_tokens):
        if isinstance(ev, inferd.Delta):
            text += ev.text
            ids += ev.token_ids
        elif isinstance(ev, inferd.Done):
            done = ev
    assert done is not None
    return text, ids, done


def test_streamed_text_equals_inferd_cli(daemon: Daemon, check: FrameChecker) -> None:
    cli = subprocess.run(
        [str(binary("inferd-cli")), "--url", daemon.url, "chat", QUESTION, "--temperature", "0", "--max-tokens", "40"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            text, ids, done = await greedy(c, QUESTION, 40)
            assert cli.stdout.rstrip("\n") == text.rstrip("\n")  # the CLI ends the answer with a newline
            assert "Paris" in text, text  # the greedy answer the Rust tests rely on too
            # The streamed ids decode to the streamed text (the final EOS, if any, to nothing).
            assert await c.detokenize(ids) == text
            assert done.usage.completion_tokens == len(ids)
            assert done.finish_reason in ("stop", "length")

    run(body())


def test_eight_concurrent_streams_on_one_connection_equal_their_solo_runs(daemon: Daemon, check: FrameChecker) -> None:
    questions = [f"Count from {i} to {i + 5}." for i in range(1, 9)]

    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            solo = [await greedy(c, q, 12) for q in questions]
            before = len(check.frames)
            together = await asyncio.gather(*(greedy(c, q, 12) for q in questions))
        assert [(t, i) for t, i, _ in together] == [(t, i) for t, i, _ in solo]
        assert len({d.id for _, _, d in together}) == 8  # one id per request
        # Not served one after another: several started before the first ended.
        kinds = [f["type"] for f in check.frames[before:] if f["type"] in ("started", "done")]
        assert kinds.index("done") >= 2, kinds

    run(body())


def test_echo_returns_the_prompt_with_its_logprobs(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            stream = c.complete("The sky is", max_tokens=0, echo=True, logprobs=True, top_logprobs=1)
            events = [ev async for ev in stream]
        assert [type(e) for e in events] == [inferd.Started, inferd.Echo, inferd.Done]
        echo = events[1]
        assert isinstance(echo, inferd.Echo)
        assert (echo.text, echo.token_ids) == ("The sky is", [504, 6376, 314])
        assert echo.logprobs is not None
        first, second = echo.logprobs[0], echo.logprobs[1]
        assert (first.token, first.logprob, first.top_logprobs) == ("The", None, [])
        assert second.token_id == 6376 and second.bytes == list(b" sky")
        assert second.logprob is not None and -13 < second.logprob < -11
        assert [t.token for t in second.top_logprobs] == ["-"]
        assert stream.done is not None and stream.done.finish_reason == "length"
        assert stream.done.usage.completion_tokens == 0
        assert stream.started is not None and stream.started.prompt_tokens == 3

    run(body())


def test_n_choices_end_with_one_done_each(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            events = [ev async for ev in c.complete("Once upon a time", n=2, max_tokens=3, seed=1)]
        ids: dict[int | None, list[int]] = {0: [], 1: []}
        for ev in events:
            if isinstance(ev, inferd.Delta):
                ids[ev.index] += ev.token_ids
        assert ids == {0: [28, 260, 1679], 1: [28, 253, 14104]}  # docs/protocol.md's example
        dones = [ev for ev in events if isinstance(ev, inferd.Done)]
        assert sorted(d.index for d in dones if d.index is not None) == [0, 1]
        assert isinstance(events[-1], inferd.Done)

    run(body())
