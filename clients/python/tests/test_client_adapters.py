"""LoRA adapters: ``adapter=`` and ``lora_scale=`` on a generation answer as the OpenAI
endpoint's ``model`` and inferd-cli's ``--adapter`` do; unknown names and bad scales are
refused; ``models()``, ``load_adapter`` and ``unload_adapter`` over HTTP."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from typing import Any

import pytest

import inferd
from client_helpers import ADAPTER, API_KEY, FrameChecker, lora_file, run, user
from inferd._http import http_base
from inferd.errors import error_from_http
from inferd_daemon import Daemon, binary

QUESTION = "What is the capital of France? Answer in one short sentence."
MAX_TOKENS = 16


async def greedy(c: inferd.Client, **params: Any) -> str:
    return await c.chat(user(QUESTION), temperature=0, max_tokens=MAX_TOKENS, **params).text()


def openai_chat(d: Daemon, model: str, **extra: Any) -> str:
    """The greedy answer of ``POST /v1/chat/completions`` with ``model``."""
    body = {"model": model, "messages": user(QUESTION), "temperature": 0, "max_tokens": MAX_TOKENS, **extra}
    request = urllib.request.Request(
        d.http_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        answer = json.load(r)
    assert answer["model"] == model
    return str(answer["choices"][0]["message"]["content"])


def cli_chat(d: Daemon, *args: str) -> str:
    out = subprocess.run(
        [str(binary("inferd-cli")), "--url", d.url, "chat", QUESTION, "--temperature", "0",
         "--max-tokens", str(MAX_TOKENS), *args],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return out.stdout.removesuffix("\n")  # the CLI ends the answer with a newline


def test_an_adapter_answers_as_the_openai_model_and_the_cli_do(lora_daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> tuple[str, str, str, str]:
        async with inferd.connect(lora_daemon.url, on_frame=check) as c:
            base_id = (await c.models())[0].id
            return base_id, await greedy(c), await greedy(c, adapter=ADAPTER), await greedy(
                c, adapter=ADAPTER, lora_scale=0.5
            )

    base_id, base, adapted, half = run(body())
    assert adapted != base, "the adapter changed nothing"
    assert half != adapted, "lora_scale changed nothing"  # (at 0.5 it is the base's answer)
    assert openai_chat(lora_daemon, base_id) == base
    assert openai_chat(lora_daemon, ADAPTER) == adapted
    assert openai_chat(lora_daemon, ADAPTER, lora_scale=0.5) == half
    assert cli_chat(lora_daemon, "--adapter", ADAPTER) == adapted
    assert cli_chat(lora_daemon, "--adapter", ADAPTER, "--lora-scale", "0.5") == half
    # The blocking client sends the same fields.
    with inferd.connect_sync(lora_daemon.url) as c:
        stream = c.complete(QUESTION, adapter=ADAPTER, lora_scale=0.5, temperature=0, max_tokens=4)
        assert stream.text() and stream.done is not None


def test_an_unknown_adapter_or_a_scale_without_one_is_refused(lora_daemon: Daemon) -> None:
    # No frame checker: docs/protocol.md's error schema predates model_not_found.
    async def body() -> None:
        async with inferd.connect(lora_daemon.url) as c:
            stream = c.chat(user("Hi"), adapter="nope", max_tokens=4)
            with pytest.raises(inferd.ModelNotFoundError) as caught:
                await stream.text()
            e = caught.value
            assert (e.type, e.id) == ("model_not_found", stream.id)
            assert 'no model or LoRA adapter is named "nope"' in e.message, e.message
            assert f'"{ADAPTER}"' in e.message, e.message  # what the daemon serves instead
            with pytest.raises(inferd.ValidationError, match=r"^lora_scale needs an adapter"):
                await c.chat(user("Hi"), lora_scale=0.5).text()
            with pytest.raises(inferd.ValidationError, match=r"^lora_scale must be a number in \[-16, 16\] \(got 17\)$"):
                await c.chat(user("Hi"), adapter=ADAPTER, lora_scale=17).text()
            with pytest.raises(inferd.ValidationError, match=r"^lora_scale must be a finite number \(got nan\)$"):
                await c.chat(user("Hi"), adapter=ADAPTER, lora_scale=float("nan")).text()
            # Errors end one request each; the connection goes on.
            assert await c.tokenize("Paris") == [38634]

    run(body())


def test_models_lists_the_base_model_then_the_adapters(lora_daemon: Daemon, limited_daemon: Daemon) -> None:
    async def body() -> None:
        async with inferd.connect(lora_daemon.url) as c:
            base, *adapters = await c.models()
        assert not base.is_adapter and base.parent is None and base.root == base.id
        assert [a.id for a in adapters] == [ADAPTER]
        assert adapters[0].is_adapter and adapters[0].parent == base.id
        assert adapters[0].root == str(lora_file("smollm2-lora-f16.gguf"))
        assert adapters[0].owned_by == "inferd" and adapters[0].created == base.created
        # The API key goes with the HTTP call too.
        async with inferd.connect(limited_daemon.url, api_key=API_KEY) as c:
            assert [m.parent for m in await c.models()] == [None]
        # Like every call, refused once the connection is closed.
        with pytest.raises(inferd.ConnectionClosedError):
            await c.models()

    run(body())
    with inferd.connect_sync(lora_daemon.url) as c:
        assert [m.id for m in c.models()][1:] == [ADAPTER]


def test_adapters_load_and_unload_at_run_time(lora_daemon: Daemon) -> None:
    path = lora_file("smollm2-lora-f32-r4.gguf")

    async def body() -> None:
        async with inferd.connect(lora_daemon.url) as c:
            await c.load_adapter("extra", path)
            assert [m.id for m in await c.models()][1:] == sorted([ADAPTER, "extra"])
            with pytest.raises(inferd.ValidationError, match="already loaded"):
                await c.load_adapter("extra", path)
            with pytest.raises(inferd.ValidationError, match=r"^lora_path \"/no/such.gguf\""):
                await c.load_adapter("other", "/no/such.gguf")

            # In use while a request generates with it: 409.
            stream = c.complete("Once upon a time", adapter="extra", max_tokens=400, min_tokens=400)
            refused: list[inferd.AdapterInUseError] = []
            async for ev in stream:
                if isinstance(ev, inferd.Delta) and not refused:
                    with pytest.raises(inferd.AdapterInUseError, match=r"^lora_name") as caught:
                        await c.unload_adapter("extra")
                    refused.append(caught.value)
                    await stream.cancel()  # and on to its Done
            assert refused[0].type == "adapter_in_use"
            assert stream.done is not None and stream.done.finish_reason == "cancelled"

            # Free once the request ended (its lease goes before its done frame).
            await c.unload_adapter("extra")
            assert [m.id for m in await c.models()][1:] == [ADAPTER]
            with pytest.raises(inferd.ModelNotFoundError) as caught:
                await c.unload_adapter("extra")
            assert caught.value.type == "model_not_found"
            with pytest.raises(inferd.ModelNotFoundError):
                await c.complete("Hi", adapter="extra", max_tokens=2).text()

    run(body())


@pytest.mark.parametrize(
    "ws, http",
    [
        ("ws://127.0.0.1:8080/v1/ws", "http://127.0.0.1:8080/v1/"),
        ("wss://example.org/inferd/v1/ws", "https://example.org/inferd/v1/"),
        ("ws://[::1]:9/v1/ws", "http://[::1]:9/v1/"),
        ("ws://127.0.0.1:8080/v1/chat", None),
        ("http://127.0.0.1:8080/v1/ws", None),
    ],
)
def test_the_http_endpoints_are_beside_the_websocket(ws: str, http: str | None) -> None:
    assert http_base(ws) == http


@pytest.mark.parametrize(
    "status, body, cls, type_, message",
    [
        (404, {"message": "lora_name: no adapter", "code": "model_not_found"}, inferd.ModelNotFoundError,
         "model_not_found", "lora_name: no adapter"),
        (409, {"message": "lora_name: in use", "code": "adapter_in_use"}, inferd.AdapterInUseError,
         "adapter_in_use", "lora_name: in use"),
        (400, {"message": "lora_path: bad", "code": "validation"}, inferd.ValidationError, "validation",
         "lora_path: bad"),
        (401, {"message": "missing API key", "code": "invalid_api_key"}, inferd.AuthenticationError,
         "invalid_api_key", "missing API key"),
        (503, {"message": "loading", "code": "loading"}, inferd.InferdError, "loading", "loading"),
        (502, None, inferd.InferdError, "http_502", "HTTP 502 from http://h/v1/models: <html>bad gateway</html>"),
    ],
)
def test_http_errors_map_to_the_classes_of_their_code(
    status: int, body: dict[str, str] | None, cls: type[inferd.InferdError], type_: str, message: str
) -> None:
    raw = json.dumps({"error": {**body, "type": "x", "param": None}}).encode() if body else b"<html>bad gateway</html>"
    e = error_from_http(status, raw, "http://h/v1/models")
    assert type(e) is cls
    assert (e.type, e.message, e.id) == (type_, message, None)
