"""Starts the real ``inferd`` binary for Python tests (pytest), the way the Rust
end-to-end harness does (``tests/src/lib.rs``): ``inferd serve --config
configs/test.toml --model <default model> --listen 127.0.0.1:0`` with the bundled
plugins and a prefix store of its own, and waits for ``inferd: listening on ws://…``.

Used by ``clients/python/tests`` and ``tests/browser``; the binary must be built
(``cargo build --workspace --bins``, which ``scripts/test.sh`` does).
"""

from __future__ import annotations

import os
import queue
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path() -> Path:
    """``$INFERD_TEST_MODEL``, ``models/``, or ``../shared/models/``."""
    env = os.environ.get("INFERD_TEST_MODEL")
    if env:
        return Path(env)
    for c in (ROOT / "models" / DEFAULT_MODEL_FILE, ROOT.parent / "shared" / "models" / DEFAULT_MODEL_FILE):
        if c.is_file():
            return c
    raise FileNotFoundError("default model not found: run scripts/fetch-model.sh")


def binary(name: str = "inferd") -> Path:
    """``$INFERD_BIN_DIR/<name>`` or ``target/debug/<name>``."""
    d = Path(os.environ.get("INFERD_BIN_DIR", ROOT / "target" / "debug"))
    p = d / name
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found: build it with `cargo build --workspace --bins`")
    return p


@dataclass
class Daemon:
    """A running daemon; :meth:`stop` kills it (the fixtures call it)."""

    proc: subprocess.Popen[str]
    url: str
    """``ws://127.0.0.1:PORT/v1/ws``."""
    _store: tempfile.TemporaryDirectory[str]
    stderr: list[str] = field(default_factory=list)

    @property
    def addr(self) -> str:
        """``127.0.0.1:PORT``."""
        return self.url.removeprefix("ws://").removesuffix("/v1/ws")

    @property
    def http_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.addr}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._store.cleanup()


def start(env: dict[str, str] | None = None, args: list[str] | None = None, timeout: float = 120.0) -> Daemon:
    """Starts a daemon with extra environment variables (``INFERD__SERVER__API_KEY``…)
    and CLI arguments, and waits until it listens."""
    store = tempfile.TemporaryDirectory(prefix="inferd-py-store-")
    full_env = dict(os.environ)
    full_env["INFERD__PLUGINS__DIR"] = os.environ.get("INFERD_PLUGINS_DIR", str(ROOT / "target" / "e2e-plugins"))
    full_env["INFERD__PREFIX_STORE__PATH"] = store.name
    full_env.update(env or {})
    cmd = [
        str(binary()),
        "serve",
        "--config",
        str(ROOT / "configs" / "test.toml"),
        "--model",
        str(model_path()),
        "--listen",
        "127.0.0.1:0",
        *(args or []),
    ]
    proc = subprocess.Popen(
        cmd, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    urls: queue.Queue[str] = queue.Queue()
    err_lines: list[str] = []

    def read_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("inferd: listening on "):
                urls.put(line.removeprefix("inferd: listening on ").strip())

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line.rstrip("\n"))

    threading.Thread(target=read_stdout, daemon=True).start()
    threading.Thread(target=read_stderr, daemon=True).start()
    try:
        url = urls.get(timeout=timeout)
    except queue.Empty:
        proc.kill()
        store.cleanup()
        raise RuntimeError("inferd did not start listening; stderr:\n" + "\n".join(err_lines[-40:])) from None
    return Daemon(proc=proc, url=url, _store=store, stderr=err_lines)


def serve(env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """A pytest fixture's body: starts a daemon (see :func:`start`), yields it, stops it."""
    d = start(env=env)
    try:
        yield d
    finally:
        d.stop()
