"""Image content parts for chat messages (docs/vision.md in the daemon's repository)."""

from __future__ import annotations

import base64
import os
from typing import Any

_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp", ".gif": "image/gif"}


def image_part(image: str | os.PathLike[str] | bytes, media_type: str | None = None) -> dict[str, Any]:
    """An OpenAI ``image_url`` content part carrying ``image`` as a base64 ``data:`` URL.

    ``image`` is a file path (read now; the media type follows its extension unless
    ``media_type`` is given) or the encoded bytes themselves (PNG, JPEG, WebP or GIF).
    The daemon never fetches URLs, so images always travel inside the request::

        c.chat([{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                             inferd.image_part("cat.png")]}])
    """
    if isinstance(image, bytes):
        data = image
    else:
        path = os.fspath(image)
        with open(path, "rb") as f:
            data = f.read()
        if media_type is None:
            media_type = _TYPES.get(os.path.splitext(path)[1].lower())
    url = f"data:{media_type or ''};base64,{base64.b64encode(data).decode('ascii')}"
    return {"type": "image_url", "image_url": {"url": url}}
