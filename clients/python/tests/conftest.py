"""Fixtures: real daemons, started once per session by ``tests/python/inferd_daemon.py``,
and a checker of every server frame against docs/protocol.md's schemas."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "python"))

import inferd_daemon  # noqa: E402
from client_helpers import ADAPTER, API_KEY, MAX_WAITING, SMALL_CONTEXT, FrameChecker, lora_file  # noqa: E402


@pytest.fixture
def check() -> Iterator[FrameChecker]:
    """A frame checker; the test fails if any frame it saw broke its schema."""
    checker = FrameChecker()
    yield checker
    assert not checker.failures, "\n".join(checker.failures)


@pytest.fixture(scope="session")
def daemon() -> Iterator[inferd_daemon.Daemon]:
    """A daemon with the test profile and the bundled plugins."""
    yield from inferd_daemon.serve()


@pytest.fixture(scope="session")
def limited_daemon() -> Iterator[inferd_daemon.Daemon]:
    """A daemon with an API key, a 40-token context and room for one running and one
    waiting request."""
    yield from inferd_daemon.serve(
        env={
            "INFERD__SERVER__API_KEY": API_KEY,
            "INFERD__MODEL__CONTEXT_LENGTH": str(SMALL_CONTEXT),
            "INFERD__SCHEDULER__MAX_RUNNING": "1",
            "INFERD__SCHEDULER__MAX_WAITING": str(MAX_WAITING),
        }
    )


@pytest.fixture(scope="session")
def lora_daemon() -> Iterator[inferd_daemon.Daemon]:
    """A daemon serving the LoRA adapter ``ADAPTER`` (``--lora-modules``) over the
    default model."""
    d = inferd_daemon.start(args=["--lora-modules", f"{ADAPTER}={lora_file('smollm2-lora-f16.gguf')}"])
    try:
        yield d
    finally:
        d.stop()
