"""The model picker against a daemon serving a LoRA adapter: it lists ``GET /v1/models``
(the base model, then the adapters); choosing an adapter sends ``"adapter"`` (and
``"lora_scale"`` when one is typed) in the generate frame, and the answer is the one the
OpenAI endpoint gives for that model; adapters loaded or unloaded at run time show up
after the next answer."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import inferd_daemon
import pytest
from chat_page import ChatPage, chromium
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select

ADAPTER = "sql"
QUESTION = "What is the capital of France? Answer in one short sentence."
MAX_TOKENS = 16


def lora_file(name: str) -> Path:
    """A LoRA adapter for the default model from ``scripts/lora-gguf.sh files``."""
    path = Path(os.environ.get("INFERD_LORA_DIR", Path.home() / ".cache" / "inferd" / "lora")) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run scripts/lora-gguf.sh files")
    return path


@pytest.fixture(scope="module")
def lora_daemon() -> Iterator[inferd_daemon.Daemon]:
    """A daemon serving the adapter ``ADAPTER`` over the default model."""
    d = inferd_daemon.start(args=["--lora-modules", f"{ADAPTER}={lora_file('smollm2-lora-f16.gguf')}"])
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def lora_page(lora_daemon: inferd_daemon.Daemon) -> Iterator[ChatPage]:
    driver = chromium()
    try:
        yield ChatPage(driver, lora_daemon.http_url)
    finally:
        driver.quit()


def post(d: inferd_daemon.Daemon, path: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        d.http_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        return bytes(r.read())


def openai_answer(d: inferd_daemon.Daemon, model: str, **extra: Any) -> str:
    """The greedy answer to QUESTION of ``/v1/chat/completions`` with ``model``."""
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
            "max_tokens": MAX_TOKENS, **extra}
    return str(json.loads(post(d, "/v1/chat/completions", body))["choices"][0]["message"]["content"])


def options(page: ChatPage) -> list[tuple[str, str]]:
    return [(o.get_attribute("value") or "", o.text) for o in Select(page.by_id("model")).options]


def ask(page: ChatPage) -> dict[str, Any]:
    """Starts a new chat, asks QUESTION, waits for the answer; returns the frame sent."""
    page.by_id("new-chat").click()
    page.type_prompt(QUESTION)
    page.wait_answer_end()
    return page.sent("generate")[-1]


def adapter_row(page: ChatPage) -> str:
    """The answer's "Adapter" metric, or "" when it is hidden (no adapter)."""
    row = page.answer().find_element(By.CSS_SELECTOR, ".m-adapter-row")
    return row.text.removeprefix("Adapter").strip() if row.is_displayed() else ""


def test_the_picker_sends_the_chosen_adapter_and_its_scale(lora_page: ChatPage, lora_daemon) -> None:
    page = lora_page.open()
    base = page.text_of("model-name")
    assert options(page) == [("", base), (ADAPTER, ADAPTER)]
    groups = page.driver.find_elements(By.CSS_SELECTOR, "#model optgroup")
    assert [g.get_attribute("label") for g in groups] == ["Base model", "LoRA adapters"]
    scale = page.by_id("lora_scale")
    assert not scale.is_enabled()  # the base model has no scale
    page.set_field("temperature", "0")
    page.set_field("max_tokens", str(MAX_TOKENS))

    Select(page.by_id("model")).select_by_value(ADAPTER)
    assert scale.is_enabled()
    frame = ask(page)
    assert page.answer_state() == "done"
    assert frame["adapter"] == ADAPTER and "lora_scale" not in frame
    adapted = page.answer_text()
    assert adapted == openai_answer(lora_daemon, ADAPTER)
    assert adapter_row(page) == ADAPTER
    page.shot("9-adapter")

    page.set_field("lora_scale", "0.5")
    frame = ask(page)
    assert (frame["adapter"], frame["lora_scale"]) == (ADAPTER, 0.5)
    assert page.answer_text() == openai_answer(lora_daemon, ADAPTER, lora_scale=0.5) != adapted
    assert adapter_row(page) == f"{ADAPTER} × 0.5"

    # Back to the base model: neither field is sent (the typed scale stays, unused).
    Select(page.by_id("model")).select_by_value("")
    assert not scale.is_enabled()
    frame = ask(page)
    assert "adapter" not in frame and "lora_scale" not in frame
    assert page.answer_text() == openai_answer(lora_daemon, base)
    assert adapter_row(page) == ""
    assert not page.console_errors(), page.console_errors()


def test_adapters_loaded_at_run_time_appear_and_an_unloaded_one_is_refused(lora_page: ChatPage, lora_daemon) -> None:
    page = lora_page.open()
    page.set_field("max_tokens", "4")
    post(lora_daemon, "/v1/load_lora_adapter", {"lora_name": "extra", "lora_path": str(lora_file("smollm2-lora-f32-r4.gguf"))})
    try:
        ask(page)  # the list is fetched again after each answer
        assert [v for v, _ in options(page)] == ["", "extra", ADAPTER]
        Select(page.by_id("model")).select_by_value("extra")
        assert ask(page)["adapter"] == "extra" and page.answer_state() == "done"
    finally:
        post(lora_daemon, "/v1/unload_lora_adapter", {"lora_name": "extra"})

    # The chosen adapter is gone: it stays chosen (marked) and the daemon refuses it.
    frame = ask(page)
    assert frame["adapter"] == "extra"
    assert page.answer_state() == "error"
    box = page.error_box()
    assert box.find_element(By.CSS_SELECTOR, ".error-tag").text == "model_not_found"
    assert 'no model or LoRA adapter is named "extra"' in box.find_element(By.CSS_SELECTOR, ".error-message").text
    assert Select(page.by_id("model")).first_selected_option.text == "extra (not loaded)"
