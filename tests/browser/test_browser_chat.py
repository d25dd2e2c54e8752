"""The chat page in a real browser: streaming, stop, settings in the request, multi-turn
history, the live stats panel, validation errors and accessibility basics."""

from __future__ import annotations

import base64

import json
import re
from urllib.request import urlopen

import pytest
from chat_page import ROOT, ChatPage, wait_for
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from websockets.sync.client import connect

STORY = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def daemon_stats(ws_url: str) -> dict:
    with connect(ws_url) as ws:
        ws.send(json.dumps({"type": "stats"}))
        return json.loads(ws.recv(timeout=30))


def test_an_answer_streams_into_the_page(page: ChatPage, daemon) -> None:
    page.open()
    with urlopen(daemon.http_url + "/v1/models") as r:
        assert page.text_of("model-name") == json.load(r)["data"][0]["id"]
    page.set_field("temperature", "0")
    page.set_field("max_tokens", "160")
    page.set_field("min_tokens", "60")
    page.type_prompt(STORY)

    # Screenshot 1 while the answer streams (still streaming after it was taken).
    first = wait_for("some streamed text", lambda: len(page.answer_text()) > 10 and page.answer_text())
    page.shot("1-streaming")
    assert page.answer_state() == "streaming", "the answer ended before the first screenshot"
    # Screenshot 2 once clearly more text arrived.
    second = wait_for("more text", lambda: len(page.answer_text()) > len(first) + 40 and page.answer_text())
    page.shot("2-streaming-more")
    assert second.startswith(first) and len(second) > len(first)

    page.wait_answer_end()
    assert page.answer_state() == "done"
    final = page.answer_text()
    assert final.startswith(second)
    assert re.fullmatch(r"\d+ ms", page.metric("ttft")), page.metric("ttft")
    assert re.fullmatch(r"\d+\.\d tok/s", page.metric("speed")), page.metric("speed")
    assert re.fullmatch(r"\d+ of \d+", page.metric("cached")), page.metric("cached")
    assert page.metric("finish") in ("stop", "length")
    tokens = int(page.metric("tokens"))
    assert 60 <= tokens <= 160
    shot = page.shot("3-finished")
    assert shot.stat().st_size > 10_000
    # The page's policy allowed everything it does (its own files, the same-origin
    # WebSocket): nothing was refused.
    assert not page.console_errors(), page.console_errors()


def test_stop_ends_a_long_answer_as_cancelled(page: ChatPage) -> None:
    page.open()
    page.set_field("max_tokens", "4000")
    page.set_field("min_tokens", "4000")
    page.type_prompt("Count from one to one thousand in words.")
    wait_for("streamed text", lambda: len(page.answer_text()) > 20)
    # Escape stops (keyboard), from anywhere on the page.
    page.driver.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    page.wait_answer_end(timeout=30)
    assert page.metric("finish") == "cancelled"
    assert int(page.metric("tokens")) < 4000
    cancels = page.sent("cancel")
    generate = page.sent("generate")[-1]
    assert cancels == [{"type": "cancel", "id": generate["id"]}]
    page.shot("4-cancelled")

    # The Stop button does the same; the cancelled answer stays in the history.
    page.type_prompt("Go on.")
    wait_for("streamed text", lambda: len(page.answers()) == 2 and len(page.answer_text()) > 20)
    page.by_id("stop").click()
    page.wait_answer_end(timeout=30)
    assert page.metric("finish") == "cancelled"
    assert len(page.sent("cancel")) == 2
    second = page.sent("generate")[-1]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]


def test_settings_go_into_the_generate_frame(page: ChatPage) -> None:
    page.open()
    page.set_field("system", "You are terse.")
    page.set_field("temperature", "0")
    page.set_field("max_tokens", "7")
    page.set_field("top_p", "0.9")
    page.set_field("top_k", "5")
    page.set_field("seed", "18446744073709551615")
    page.set_field("stop-strings", "\\n\\n\nTHE END")
    # Shift+Enter is a new line, not a send.
    page.type_prompt("Hi", enter=False)
    page.by_id("prompt").send_keys(Keys.SHIFT, Keys.ENTER)
    page.by_id("prompt").send_keys("there")
    assert page.by_id("prompt").get_attribute("value") == "Hi\nthere"
    assert not page.answers()
    page.by_id("prompt").send_keys(Keys.ENTER)
    page.wait_answer_end()
    [frame] = page.sent("generate")
    assert frame["temperature"] == 0
    assert frame["max_tokens"] == 7
    assert frame["top_p"] == 0.9
    assert frame["top_k"] == 5
    assert frame["seed"] == 18446744073709551615  # every digit, as typed
    assert frame["stop"] == ["\n\n", "THE END"]
    assert frame["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi\nthere"},
    ]
    assert "min_tokens" not in frame and "plugins" not in frame  # empty: the default
    assert page.metric("finish") in ("length", "stop")
    assert int(page.metric("tokens")) <= 7


def test_the_second_turn_carries_the_first_answer(page: ChatPage) -> None:
    page.open()
    page.set_field("temperature", "0")
    page.set_field("max_tokens", "16")
    page.type_prompt("My name is Ada. Say hello to me.")
    page.wait_answer_end()
    first_answer = page.answer_text()
    assert first_answer
    page.type_prompt("What is my name?")
    wait_for("the second answer", lambda: len(page.answers()) == 2)
    page.wait_answer_end()
    first, second = page.sent("generate")
    assert first["messages"] == [{"role": "user", "content": "My name is Ada. Say hello to me."}]
    assert second["messages"] == [
        {"role": "user", "content": "My name is Ada. Say hello to me."},
        {"role": "assistant", "content": first_answer},
        {"role": "user", "content": "What is my name?"},
    ]
    assert first["id"] != second["id"]
    page.shot("5-multi-turn")

    # New chat forgets the history.
    page.by_id("new-chat").click()
    assert not page.answers()
    page.type_prompt("Hello")
    page.wait_answer_end()
    assert page.sent("generate")[-1]["messages"] == [{"role": "user", "content": "Hello"}]


def test_the_live_panel_shows_the_daemons_stats(page: ChatPage, daemon) -> None:
    page.open()
    total = daemon_stats(daemon.url)["kv_blocks_total"]
    assert total > 0
    wait_for("the KV panel", lambda: page.text_of("stat-kv").endswith(f"/ {total}"))
    page.set_field("max_tokens", "300")
    page.set_field("min_tokens", "300")
    page.type_prompt(STORY)
    wait_for("streamed text", lambda: page.answer_text())
    # Polled while it generates: one running request holding KV blocks.
    wait_for("running 1", lambda: page.text_of("stat-running") == "1", timeout=30)
    used = int(page.text_of("stat-kv").split(" / ")[0])
    assert 0 < used <= total
    assert int(page.by_id("kv-meter").get_attribute("max")) == total
    before = len(page.sent("stats"))
    wait_for("more stats polls", lambda: len(page.sent("stats")) >= before + 2, timeout=30)
    page.shot("6-live-stats")
    page.by_id("stop").click()
    page.wait_answer_end(timeout=30)
    wait_for("running 0 after the answer", lambda: page.text_of("stat-running") == "0", timeout=30)


def test_a_refused_value_is_shown_next_to_the_answer(page: ChatPage) -> None:
    page.open()
    page.set_field("temperature", "-1")
    page.type_prompt("Hello")
    assert page.wait_answer_end() == "error"
    box = page.error_box()
    assert box.is_displayed()
    assert box.find_element(By.CSS_SELECTOR, ".error-tag").text == "validation"
    assert "temperature must be >= 0 (got -1)" in box.text
    assert page.metric("finish") == "error"
    # The prompt comes back to resend once the setting is fixed; the failed turn is not
    # part of the history.
    assert page.by_id("prompt").get_attribute("value") == "Hello"
    page.shot("7-validation-error")
    page.set_field("temperature", "abc")
    page.by_id("prompt").send_keys(Keys.ENTER)
    wait_for("the second answer", lambda: len(page.answers()) == 2)
    assert page.wait_answer_end() == "error"
    assert "temperature" in page.error_box().text
    assert page.sent("generate")[-1]["temperature"] == "abc"  # sent as typed
    page.set_field("temperature", "0")
    page.set_field("max_tokens", "3")
    page.by_id("prompt").send_keys(Keys.ENTER)
    wait_for("the third answer", lambda: len(page.answers()) == 3)
    assert page.wait_answer_end() == "done"
    assert page.sent("generate")[-1]["messages"] == [{"role": "user", "content": "Hello"}]


def test_an_attached_image_goes_as_a_data_url_part(page: ChatPage, tmp_path) -> None:
    png = tmp_path / "dot.png"
    png.write_bytes(base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    ))
    page.open()
    page.by_id("attach").send_keys(str(png))
    wait_for("the attachment chip", lambda: page.by_id("attachments").is_displayed())
    assert "dot.png" in page.text_of("attachments")
    page.type_prompt("What is this?")
    assert page.wait_answer_end() == "error"
    content = page.sent("generate")[-1]["messages"][-1]["content"]
    assert content[0] == {"type": "text", "text": "What is this?"}
    assert content[1]["type"] == "image_url"
    assert content[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    box = page.error_box()
    assert box.find_element(By.CSS_SELECTOR, ".error-tag").text == "validation"
    assert 'model "SmolLM2-135M-Instruct.Q4_1" takes no images' in box.text
    # The failed turn gives back its text and its image to resend.
    assert page.by_id("prompt").get_attribute("value") == "What is this?"
    assert "dot.png" in page.text_of("attachments")
    page.shot("9-image-refused")


def test_plugins_listed_by_the_daemon_can_be_chosen(page: ChatPage) -> None:
    if not list((ROOT / "target" / "e2e-plugins").glob("*.wasm")):
        pytest.skip("no bundled plugins built (scripts/build-plugins.sh)")
    page.open()
    wait_for("the plugin list", lambda: page.driver.find_elements(By.CSS_SELECTOR, "#plugin-list li"))
    names = [li.get_attribute("data-name") for li in page.driver.find_elements(By.CSS_SELECTOR, "#plugin-list li")]
    assert "ban_words" in names, names
    i = names.index("ban_words")
    page.by_id(f"plugin-{i}").click()
    page.set_field(f"plugin-config-{i}", '{"words": ["Paris"]}')
    page.set_field("temperature", "0")
    page.set_field("max_tokens", "24")
    page.type_prompt("What is the capital of France?")
    page.wait_answer_end()
    assert page.answer_state() == "done"
    assert page.sent("generate")[-1]["plugins"] == [{"name": "ban_words", "config": {"words": ["Paris"]}}]
    assert "Paris" not in page.answer_text()
    # A config that is not JSON is caught before sending.
    page.set_field(f"plugin-config-{i}", "{words")
    page.type_prompt("Hi")
    wait_for("the notice", lambda: page.by_id("notice").is_displayed())
    assert "not JSON" in page.text_of("notice")
    assert len(page.answers()) == 1


def test_every_control_has_a_label(page: ChatPage) -> None:
    page.open()
    wait_for("the plugin list", lambda: page.sent("plugins"))
    unlabelled = page.driver.execute_script(
        """return [...document.querySelectorAll('input, textarea, select, button, meter')]
             .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                        && !el.getAttribute('aria-labelledby') && !el.textContent.trim())
             .map(el => el.outerHTML);"""
    )
    assert unlabelled == []
    # The streamed answer lives in a live region.
    log = page.by_id("transcript")
    assert log.get_attribute("role") == "log" and log.get_attribute("aria-live") == "polite"
    # The message box has focus at load, so Enter sends at once.
    assert page.driver.switch_to.active_element.get_attribute("id") == "prompt"


def test_the_policy_confines_the_page_to_its_origin(page: ChatPage, daemon) -> None:
    page.open()
    # The same-origin WebSocket is allowed by connect-src 'self' (the page is online);
    # another origin is refused by the policy, both for fetch and for a WebSocket.
    other_port = daemon.addr.rsplit(":", 1)[0] + ":9"
    violations = page.driver.execute_async_script(
        """const done = arguments[arguments.length - 1];
           const seen = [];
           document.addEventListener("securitypolicyviolation",
             (e) => seen.push([e.violatedDirective, e.blockedURI]));
           fetch("http://%s/").catch(() => {});
           try { new WebSocket("ws://%s/v1/ws"); } catch (e) { seen.push(["throw", e.name]); }
           setTimeout(() => done(seen), 500);"""
        % (other_port, other_port)
    )
    assert sorted(map(tuple, violations)) == [
        ("connect-src", f"http://{other_port}/"),
        ("connect-src", f"ws://{other_port}/v1/ws"),
    ], violations
