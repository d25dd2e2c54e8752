"""Fixtures: a daemon (and one with an API key) started once per session by
``tests/python/inferd_daemon.py``, and a fresh headless Chromium per test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import inferd_daemon  # noqa: E402
from chat_page import API_KEY, ChatPage, chromium  # noqa: E402


@pytest.fixture(scope="session")
def daemon() -> Iterator[inferd_daemon.Daemon]:
    """A daemon with the test profile and the bundled plugins, no API key."""
    yield from inferd_daemon.serve()


@pytest.fixture(scope="session")
def keyed_daemon() -> Iterator[inferd_daemon.Daemon]:
    """A daemon that requires ``API_KEY``."""
    yield from inferd_daemon.serve(env={"INFERD__SERVER__API_KEY": API_KEY})


def _page(d: inferd_daemon.Daemon) -> Iterator[ChatPage]:
    driver = chromium()
    try:
        yield ChatPage(driver, d.http_url)
    finally:
        driver.quit()


@pytest.fixture
def page(daemon: inferd_daemon.Daemon) -> Iterator[ChatPage]:
    """The chat page of ``daemon`` in a fresh browser (not loaded yet)."""
    yield from _page(daemon)


@pytest.fixture
def keyed_page(keyed_daemon: inferd_daemon.Daemon) -> Iterator[ChatPage]:
    """The chat page of ``keyed_daemon`` in a fresh browser (not loaded yet)."""
    yield from _page(keyed_daemon)
