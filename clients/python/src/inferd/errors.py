"""Exceptions: one class per protocol error tag, all subclasses of :class:`InferdError`."""

from __future__ import annotations

import json
from typing import Any


class InferdError(Exception):
    """Base class of every error this package raises for the daemon.

    ``message`` is the daemon's human-readable text, ``type`` its stable tag
    (``"validation"``, ``"overloaded"``, …) and ``id`` the request id the error is
    about (``None`` when the daemon could not tell, or for connection-level errors).
    An error tag this version does not know raises this base class itself.
    """

    def __init__(self, message: str, type: str, id: str | None = None) -> None:
        super().__init__(message, type, id)
        self.message = message
        self.type = type
        self.id = id

    def __str__(self) -> str:
        return self.message


class ValidationError(InferdError):
    """``validation``: the frame was malformed or a value out of range."""


class ContextLengthExceededError(InferdError):
    """``context_length_exceeded``: the prompt leaves no room for one generated token."""


class OverloadedError(InferdError):
    """``overloaded``: a queue bound was hit; retry later."""


class PluginTrapError(InferdError):
    """``plugin_trap``: a Wasm plugin of the request trapped, missed its deadline or
    answered something invalid."""


class RequestCancelledError(InferdError):
    """``cancelled``: the request was cancelled before it started (e.g. by a shutdown).

    A started request that is cancelled ends normally, with a ``Done`` event whose
    ``finish_reason`` is ``"cancelled"``."""


class InternalError(InferdError):
    """``internal``: a failure inside the daemon; the connection stays usable."""


class ModelNotFoundError(InferdError):
    """``model_not_found``: the request named a LoRA adapter (``adapter=``) the daemon
    does not serve; the message lists the ones it does. Also raised by
    :meth:`~inferd.Client.unload_adapter` for an unknown name."""


class AdapterInUseError(InferdError):
    """``adapter_in_use``: :meth:`~inferd.Client.unload_adapter` was refused (HTTP 409)
    because requests are generating with the adapter; retry when they end."""


class AuthenticationError(InferdError):
    """The WebSocket handshake was refused with HTTP 401: the daemon's
    ``server.api_key`` is set and the key given was missing or wrong.
    ``type`` is the body's error code (``"invalid_api_key"``)."""


class ConnectError(InferdError):
    """The connection could not be opened: a malformed URL, nothing listening, a
    handshake that failed (e.g. HTTP 404 for a wrong path) or timed out. The message
    names the URL and the cause; ``type`` is ``"connect_failed"``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "connect_failed")


class ConnectionClosedError(InferdError):
    """The connection closed (or failed) while the request was open, or the client
    was used after it closed. Nothing reconnects by itself: open a new client.
    ``type`` is ``"connection_closed"``."""


_BY_TAG: dict[str, type[InferdError]] = {
    "validation": ValidationError,
    "context_length_exceeded": ContextLengthExceededError,
    "overloaded": OverloadedError,
    "plugin_trap": PluginTrapError,
    "cancelled": RequestCancelledError,
    "internal": InternalError,
    "model_not_found": ModelNotFoundError,
    "adapter_in_use": AdapterInUseError,
}


def error_from_frame(frame: dict[str, Any]) -> InferdError:
    """The exception for a server ``error`` frame."""
    body = frame.get("error") or {}
    tag = str(body.get("type", "unknown"))
    return _BY_TAG.get(tag, InferdError)(str(body.get("message", "")), tag, frame.get("id"))


def error_from_http(status: int, body: bytes, url: str) -> InferdError:
    """The exception for an HTTP error answer of the daemon, whose body is OpenAI's
    ``{"error": {"message", "type", "param", "code"}}``: the class of the ``code``
    (``validation``, ``model_not_found``, ``adapter_in_use``, ``invalid_api_key``, …);
    a body that is not such JSON raises the base class tagged ``http_<status>``."""
    try:
        error = json.loads(body)["error"]
        message, code = str(error["message"]), str(error["code"])
    except (ValueError, KeyError, TypeError):
        text = body.decode("utf-8", "replace").strip()[:200]
        return InferdError(f"HTTP {status} from {url}: {text}", f"http_{status}")
    if code == "invalid_api_key":
        return AuthenticationError(message, code)
    return _BY_TAG.get(code, InferdError)(message, code)
