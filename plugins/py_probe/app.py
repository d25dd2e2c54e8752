"""`py_probe`: a test-only fixture built with componentize-py, for the daemon's tests of
Python plugins: their cost (logits copy, memory, import snapshot), deadlines, traps and
the WASI sandbox as CPython sees it. Not loaded by default (built into the test-only
output directory).

World: `logits-processor-plugin` (inferd:plugin@0.1.1): `process` receives the full
logits row as a Python list (the host lowers 49,152 floats per step).

Config: a JSON object with at most one of these modes:
- `{}`: `process` answers `keep` (the fixed cost of a Python plugin with the row copy).
- `{"scan": true}`: `process` reads every logit in a plain Python loop, finds the argmax
  (lowest id on ties) and answers `bias([{token: argmax, bias: 0.0}])` (a no-op edit).
- `{"spin": true}`: `process` never returns (`while True: pass`): deadline tests.
- `{"alloc_mb": N}` (integer 1 to 4095): each `process` allocates N MiB
  (`bytearray(N << 20)`), writes one byte per 4 KiB page, keeps it alive in a
  module-level list and answers `keep`: memory-limit tests.
- `{"raise": true}`: `process` raises `RuntimeError("py_probe: raised on purpose")`,
  uncaught. componentize-py turns an uncaught exception other than
  `componentize_py_types.Err` into a trap (it prints the traceback to stderr, then
  aborts the call), not an `err` result.
- `{"err": "msg"}`: `process` raises `Err("msg")`: the call returns `err("msg")`.
- `{"import": "statistics"}`: `configure` imports that module (one the app does not
  import at top level, so it is not in componentize-py's build-time snapshot), then
  behaves as `{}`; it shows what the snapshot implies. In a sandbox without files
  (the daemon's) such an import fails, since componentize-py 0.25 keeps only the
  snapshotted modules, not the standard library's files: the config is then rejected
  with `py_probe: import statistics failed: ModuleNotFoundError: No module named
  'statistics'`.
- `{"report": true}`: `configure` probes the sandbox, prints
  `py_probe: hello on stdout` / `py_probe: hello on stderr`, and rejects the config
  with one line:
  `file=<ok|exc> env=<n> tcp=<ok|exc> dns=<ok|exc> wall=<s> mono=<ns> random=<hex16>
   urandom=<hex16> stdin=<n|exc>`
  where exc is the exception's class name, file = open('/etc/passwd').read(),
  env = len(os.environ), tcp = socket.create_connection(('127.0.0.1', 80), timeout=1),
  dns = socket.getaddrinfo('localhost', 80), wall = int(time.time()), mono = the
  nanoseconds time.monotonic_ns() advances across time.sleep(1.5), random =
  random.Random().getrandbits(64) (a fresh generator, seeded by Python from
  os.urandom at run time), urandom = os.urandom(8), stdin = len(sys.stdin.buffer.read()).
Anything else rejects the config with a message naming the problem.
"""

import importlib
import json
import math
import os
import random
import sys
import time
from typing import List

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types

# Everything the probe uses is imported here, at top level, so that it is in
# componentize-py's build-time snapshot: at run time the sandbox has no filesystem, so a
# module the snapshot lacks cannot be imported (ModuleNotFoundError). `encodings.idna` is
# what `socket.create_connection`/`getaddrinfo` use to encode the host name; without it
# they fail with LookupError (unknown encoding: idna) before reaching WASI sockets.
try:
    import encodings.idna  # noqa: F401
    import socket
except BaseException as e:  # noqa: BLE001 - reported by {"report": true}
    socket = None
    _socket_error = type(e).__name__

# The mode set by configure: "keep", "scan", "spin", "alloc", "raise" or "err".
_mode = "keep"
_alloc_mb = 0
_err_message = ""
# Every block allocated by {"alloc_mb": N}, kept alive for the instance's lifetime.
_held: List[bytearray] = []

# Each mode and what its value must be.
_MODES = {
    "scan": "true",
    "spin": "true",
    "raise": "true",
    "report": "true",
    "alloc_mb": "an integer from 1 to 4095",
    "err": "a string",
    "import": "a module name (string)",
}


def _outcome(action) -> str:
    """`ok`, or the class name of the exception `action()` raised."""
    try:
        action()
        return "ok"
    except BaseException as e:  # noqa: BLE001 - the class is the result
        return type(e).__name__


def _read_file() -> None:
    with open("/etc/passwd") as f:
        f.read()


def _tcp() -> None:
    if socket is None:
        raise ImportError(_socket_error)
    socket.create_connection(("127.0.0.1", 80), timeout=1).close()


def _dns() -> None:
    if socket is None:
        raise ImportError(_socket_error)
    socket.getaddrinfo("localhost", 80)


def report() -> str:
    """The one-line sandbox report of `{"report": true}`."""
    file = _outcome(_read_file)
    env = len(os.environ)
    tcp = _outcome(_tcp)
    dns = _outcome(_dns)
    wall = int(time.time())
    t0 = time.monotonic_ns()
    time.sleep(1.5)
    mono = time.monotonic_ns() - t0
    rand = random.Random().getrandbits(64)
    urandom = os.urandom(8).hex()
    try:
        stdin = str(len(sys.stdin.buffer.read()))
    except BaseException as e:  # noqa: BLE001
        stdin = type(e).__name__
    print("py_probe: hello on stdout", flush=True)
    print("py_probe: hello on stderr", file=sys.stderr, flush=True)
    return (
        f"file={file} env={env} tcp={tcp} dns={dns} wall={wall} mono={mono} "
        f"random={rand:016x} urandom={urandom} stdin={stdin}"
    )


def _configure(config: str) -> None:
    global _mode, _alloc_mb, _err_message
    try:
        cfg = json.loads(config)
    except ValueError as e:
        raise Err(f"py_probe: config is not valid JSON ({e})")
    if not isinstance(cfg, dict):
        raise Err(f"py_probe: config must be a JSON object, got {config.strip()[:80]}")
    if not cfg:
        _mode = "keep"
        return
    if len(cfg) > 1:
        raise Err(f"py_probe: config must set one mode at a time, got {', '.join(sorted(cfg))}")
    ((key, value),) = cfg.items()
    if key not in _MODES:
        raise Err(f"py_probe: unknown mode {key!r} (known: {', '.join(_MODES)})")
    bad = Err(f"py_probe: {key} must be {_MODES[key]}, got {json.dumps(value)[:80]}")
    if _MODES[key] == "true":
        if value is not True:
            raise bad
        if key == "report":
            raise Err(report())
        _mode = key
    elif key == "alloc_mb":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4095:
            raise bad
        _mode, _alloc_mb = "alloc", value
    elif key == "err":
        if not isinstance(value, str):
            raise bad
        _mode, _err_message = "err", value
    else:  # import
        if not isinstance(value, str) or not value:
            raise bad
        try:
            importlib.import_module(value)
        except BaseException as e:  # noqa: BLE001
            raise Err(f"py_probe: import {value} failed: {type(e).__name__}: {e}")
        _mode = "keep"


class LogitsProcessor(exports.LogitsProcessor):
    def info(self) -> types.PluginInfo:
        return types.PluginInfo(
            name="py_probe",
            version="0.1.0",
            description="Test fixture: probes a componentize-py plugin's costs, limits and sandbox",
        )

    def configure(self, config: str, seed: int) -> None:
        _configure(config)

    def process(self, ctx: types.StepContext, logits: List[float]) -> types.LogitsEdit:
        mode = _mode
        if mode == "keep":
            return types.LogitsEdit_Keep()
        if mode == "scan":
            best, best_id = -math.inf, 0
            for i, x in enumerate(logits):
                if x > best:
                    best, best_id = x, i
            return types.LogitsEdit_Bias([types.TokenBias(token=best_id, bias=0.0)])
        if mode == "spin":
            while True:
                pass
        if mode == "alloc":
            block = bytearray(_alloc_mb << 20)
            block[::4096] = b"\x01" * len(range(0, len(block), 4096))
            _held.append(block)
            return types.LogitsEdit_Keep()
        if mode == "raise":
            raise RuntimeError("py_probe: raised on purpose")
        raise Err(_err_message)
