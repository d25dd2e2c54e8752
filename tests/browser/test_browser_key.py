"""The chat page against a daemon with ``server.api_key``: the page itself is public,
a missing or wrong key is reported as refused, the right one connects (the WebSocket
carries it as the ``inferd.key.`` subprotocol), and "remember" keeps it for the tab."""

from __future__ import annotations

import base64

from chat_page import API_KEY, ChatPage, wait_for


def connect_with(page: ChatPage, key: str) -> None:
    page.set_field("api-key", key)
    page.by_id("connect").click()


def test_a_wrong_key_is_refused_and_the_right_one_works(keyed_page: ChatPage) -> None:
    page = keyed_page
    # Served without the key, but nothing else works without it.
    page.open(expect="refused")
    assert "this daemon needs an API key" in page.text_of("notice")
    assert page.text_of("conn-text") == "Key needed"

    connect_with(page, "not-the-key")
    page.wait_conn("refused")
    wait_for("the refusal", lambda: "connection refused: check the API key" in page.text_of("notice"))
    assert "connection refused: check the API key" in page.text_of("key-status")
    assert page.text_of("conn-text") == "Key refused"
    page.shot("8-key-refused")

    connect_with(page, API_KEY)
    page.wait_conn("online")
    assert page.by_id("notice").is_displayed() is False
    page.set_field("max_tokens", "4")
    page.type_prompt("Hello")
    assert page.wait_answer_end() == "done"
    # The handshake offered inferd.v1 and the key, base64url without padding.
    encoded = base64.urlsafe_b64encode(API_KEY.encode()).decode().rstrip("=")
    offers = [
        {k.lower(): v for k, v in h.items()}.get("sec-websocket-protocol", "") for h in page.handshakes()
    ]
    assert f"inferd.v1, inferd.key.{encoded}" in offers, offers
    # The key is not kept unless asked.
    assert page.driver.execute_script("return sessionStorage.length") == 0


def test_remember_keeps_the_key_for_the_tab(keyed_page: ChatPage) -> None:
    page = keyed_page
    page.open(expect="refused")
    page.by_id("remember-key").click()
    connect_with(page, API_KEY)
    page.wait_conn("online")
    page.driver.refresh()
    page.wait_conn("online")
    assert page.by_id("api-key").get_attribute("value") == API_KEY
    # Unticking forgets it.
    page.by_id("remember-key").click()
    assert page.driver.execute_script("return sessionStorage.length") == 0
