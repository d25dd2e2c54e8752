"""Drives the chat page served at ``GET /`` in Debian's headless Chromium (Selenium with
Debian's chromedriver: nothing is downloaded) and reads the WebSocket frames the page
sent from Chromium's performance log."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "target" / "browser"
"""Screenshots for review."""
API_KEY = "browser-key-0123"
"""The key of the ``keyed_daemon`` fixture."""

T = TypeVar("T")


def chromium() -> webdriver.Chrome:
    """A headless Chromium at 1280×860 that logs network events (WebSocket frames)."""
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,860",
        "--force-device-scale-factor=1",
        "--lang=en-US",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def wait_for(what: str, fn: Callable[[], T], timeout: float = 60.0, every: float = 0.05) -> T:
    """Polls ``fn`` until it returns something truthy; fails naming ``what``."""
    end = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class ChatPage:
    """The page in one browser, with the frames it sent collected from the log."""

    def __init__(self, driver: webdriver.Chrome, http_url: str) -> None:
        self.driver = driver
        self.http_url = http_url
        self._frames: list[dict[str, Any]] = []
        self._handshakes: list[dict[str, Any]] = []
        self.console: list[dict[str, Any]] = []

    # ---- navigation ----

    def open(self, expect: str = "online") -> "ChatPage":
        """Loads ``/`` and waits for the connection pill to reach ``expect``."""
        self.driver.get(self.http_url + "/")
        self.wait_conn(expect)
        return self

    def conn_state(self) -> str:
        return self.by_id("conn").get_attribute("data-state") or ""

    def wait_conn(self, expect: str, timeout: float = 60.0) -> None:
        wait_for(
            f"connection state {expect!r}",
            lambda: self.conn_state() == expect,
            timeout,
        )

    def by_id(self, id_: str) -> WebElement:
        return self.driver.find_element(By.ID, id_)

    def text_of(self, id_: str) -> str:
        return self.by_id(id_).text

    def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    # ---- settings ----

    def set_field(self, id_: str, value: str) -> None:
        el = self.by_id(id_)
        el.clear()
        if value:
            el.send_keys(value)

    # ---- chat ----

    def type_prompt(self, text: str, enter: bool = True) -> None:
        box = self.by_id("prompt")
        box.send_keys(text)
        if enter:
            box.send_keys(Keys.ENTER)

    def answers(self) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, "#transcript .msg-answer")

    def answer(self, i: int = -1) -> WebElement:
        return self.answers()[i]

    def answer_text(self, i: int = -1) -> str:
        # textContent, not .text: the rendered text trims trailing whitespace.
        return self.answer(i).find_element(By.CSS_SELECTOR, ".answer-text").get_attribute("textContent") or ""

    def answer_state(self, i: int = -1) -> str:
        return self.answer(i).get_attribute("data-state") or ""

    def metric(self, name: str, i: int = -1) -> str:
        return self.answer(i).find_element(By.CSS_SELECTOR, f".m-{name}").text

    def wait_answer_end(self, i: int = -1, timeout: float = 120.0) -> str:
        """Waits for the answer to be done or failed; returns the state."""
        def ended() -> str:
            state = self.answer_state(i)
            return state if state in ("done", "error") else ""

        return wait_for("the answer to end", ended, timeout)

    def error_box(self, i: int = -1) -> WebElement:
        return self.answer(i).find_element(By.CSS_SELECTOR, ".answer-error")

    # ---- what the page sent ----

    def _drain_log(self) -> None:
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            method = msg.get("method")
            if method == "Network.webSocketFrameSent":
                self._frames.append(json.loads(msg["params"]["response"]["payloadData"]))
            elif method == "Network.webSocketWillSendHandshakeRequest":
                self._handshakes.append(msg["params"]["request"]["headers"])

    def sent(self, type_: str | None = None) -> list[dict[str, Any]]:
        """The JSON frames the page sent so far (of one ``type`` when given)."""
        self._drain_log()
        return [f for f in self._frames if type_ is None or f.get("type") == type_]

    def handshakes(self) -> list[dict[str, Any]]:
        """The request headers of each WebSocket handshake the page made."""
        self._drain_log()
        return self._handshakes

    def console_errors(self) -> list[str]:
        self.console.extend(self.driver.get_log("browser"))
        return [e["message"] for e in self.console if e.get("level") == "SEVERE"]
