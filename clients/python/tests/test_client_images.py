"""Images as content parts: ``inferd.image_part`` builds the data: URL part; the default
model (text only) refuses it with a validation error naming the model and the part."""

from __future__ import annotations

import base64

import pytest

import inferd
from client_helpers import FrameChecker, run
from inferd_daemon import Daemon
from inferd.events import Done, parse_event

# A 1x1 PNG.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def test_image_part_from_a_file_and_from_bytes(tmp_path) -> None:
    path = tmp_path / "dot.PNG"
    path.write_bytes(PNG)
    part = inferd.image_part(path)
    assert part == {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()}}
    assert inferd.image_part(PNG)["image_url"]["url"].startswith("data:;base64,iVBORw0KGgo")
    assert inferd.image_part(PNG, "image/png")["image_url"]["url"].startswith("data:image/png;base64,")


def test_a_text_only_model_refuses_an_image_naming_it(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            content = [{"type": "text", "text": "What is this?"}, inferd.image_part(PNG)]
            with pytest.raises(inferd.ValidationError) as caught:
                await c.chat([{"role": "user", "content": content}], max_tokens=4).text()
            assert caught.value.message.startswith(
                'messages[0].content[1]: model "SmolLM2-135M-Instruct.Q4_1" takes no images'
            )
            # The connection goes on.
            assert await c.tokenize("Paris") == [38634]

    run(body())


def test_done_usage_carries_image_tokens_when_the_frame_has_them() -> None:
    frame = {
        "type": "done",
        "id": "r1",
        "finish_reason": "length",
        "usage": {"prompt_tokens": 46, "completion_tokens": 8, "cached_tokens": 32,
                  "draft_tokens": 0, "accepted_draft_tokens": 0, "image_tokens": 16},
        "timings": {"ttft_ms": 1.0, "decode_tokens_per_s": 2.0},
    }
    done = parse_event(frame)
    assert isinstance(done, Done)
    assert done.usage.image_tokens == 16
    del frame["usage"]["image_tokens"]
    assert parse_event(frame).usage.image_tokens == 0
