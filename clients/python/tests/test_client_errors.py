"""Every protocol error raises its own exception class carrying the daemon's message,
type and id; the API key is checked at the handshake."""

from __future__ import annotations

import asyncio

import pytest

import inferd
from client_helpers import API_KEY, MAX_WAITING, SMALL_CONTEXT, FrameChecker, run, user
from inferd.errors import error_from_frame
from inferd_daemon import Daemon

FRANCE = user("What is the capital of France? Answer in one short sentence.")


def test_validation_errors_carry_the_daemons_message_and_the_request_id(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            stream = c.chat(FRANCE, temperature=-1)
            with pytest.raises(inferd.ValidationError) as caught:
                await stream.text()
            e = caught.value
            assert (e.message, e.type, e.id) == ("temperature must be >= 0 (got -1)", "validation", stream.id)
            with pytest.raises(inferd.ValidationError, match=r'^unknown field "temprature" in generate message'):
                await c.chat(FRANCE, temprature=0.5).text()
            with pytest.raises(inferd.ValidationError, match=r"^token_ids\[0\] must be < the vocabulary size 49152 \(got 49152\)$"):
                await c.detokenize([49152])
            # An error ends one request; the connection goes on.
            assert await c.tokenize("Paris") == [38634]

    run(body())


def test_a_plugin_trap_fails_its_request_after_its_first_tokens(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            stream = c.chat(FRANCE, max_tokens=32, plugins=[{"name": "trap", "config": {"after_steps": 3}}])
            ids: list[int] = []
            with pytest.raises(inferd.PluginTrapError) as caught:
                async for ev in stream:
                    if isinstance(ev, inferd.Delta):
                        ids += ev.token_ids
            assert caught.value.message == (
                f"plugin trap (request {stream.id}) (plugins[0]) trapped: "
                "unreachable instruction (a panic or abort in the plugin) in process"
            )
            assert (caught.value.type, caught.value.id) == ("plugin_trap", stream.id)
            assert stream.started is not None and len(ids) <= 3
            with pytest.raises(inferd.ValidationError, match=r"plugins\[0\]"):
                await c.chat(FRANCE, plugins=[{"name": "no_such_plugin"}]).text()

    run(body())


def test_a_prompt_longer_than_the_context_is_refused(limited_daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(limited_daemon.url, api_key=API_KEY, on_frame=check) as c:
            prompt = "word " * 60
            n = len(await c.tokenize(prompt))
            stream = c.complete(prompt, max_tokens=5)
            with pytest.raises(inferd.ContextLengthExceededError) as caught:
                await stream.text()
            assert caught.value.message == (
                f"the prompt has {n} tokens but the context window is {SMALL_CONTEXT} tokens "
                "(at least 1 token must remain for generation)"
            )
            assert (caught.value.type, caught.value.id) == ("context_length_exceeded", stream.id)

    run(body())


def test_requests_beyond_max_waiting_are_refused_as_overloaded(limited_daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(limited_daemon.url, api_key=API_KEY, on_frame=check) as c:
            streams = [c.complete("Once upon a time", max_tokens=8, temperature=0) for _ in range(4)]
            results = await asyncio.gather(*(s.text() for s in streams), return_exceptions=True)
        # One runs, MAX_WAITING waits, the rest are refused at once.
        texts = [r for r in results if isinstance(r, str)]
        refused = [(s, r) for s, r in zip(streams, results) if isinstance(r, inferd.OverloadedError)]
        assert len(texts) == 1 + MAX_WAITING and len(refused) == 3 - MAX_WAITING, results
        assert texts == [", the city of New Haven was a"] * len(texts)
        for stream, r in refused:
            assert (r.type, r.id) == ("overloaded", stream.id)
            assert f"scheduler.max_waiting = {MAX_WAITING}" in r.message, r.message

    run(body())


def test_the_api_key_is_checked_at_the_handshake(limited_daemon: Daemon) -> None:
    async def body() -> None:
        async with inferd.connect(limited_daemon.url, api_key=API_KEY) as c:
            assert await c.tokenize("Paris") == [38634]
        for key, reason in [("wrong", "incorrect API key"), (None, "missing API key")]:
            with pytest.raises(inferd.AuthenticationError) as caught:
                await inferd.connect(limited_daemon.url, api_key=key)
            assert caught.value.message.startswith(reason), caught.value.message
            assert (caught.value.type, caught.value.id) == ("invalid_api_key", None)

    run(body())


@pytest.mark.parametrize(
    "tag, cls",
    [
        ("validation", inferd.ValidationError),
        ("context_length_exceeded", inferd.ContextLengthExceededError),
        ("overloaded", inferd.OverloadedError),
        ("plugin_trap", inferd.PluginTrapError),
        ("cancelled", inferd.RequestCancelledError),
        ("internal", inferd.InternalError),
        ("model_not_found", inferd.ModelNotFoundError),
        ("adapter_in_use", inferd.AdapterInUseError),
        ("from_the_future", inferd.InferdError),
    ],
)
def test_each_error_tag_maps_to_its_class(tag: str, cls: type[inferd.InferdError]) -> None:
    # cancelled and internal cannot be provoked from a client; the mapping is the same.
    e = error_from_frame({"type": "error", "id": "r7", "error": {"type": tag, "message": "m"}})
    assert type(e) is cls and isinstance(e, inferd.InferdError)
    assert (str(e), e.message, e.type, e.id) == ("m", "m", tag, "r7")
