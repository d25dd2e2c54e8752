"""Sends an image to inferd with the official `openai` package, unchanged, as a data URL,
and streams the answer.

Usage: openai_image.py BASE_URL IMAGE_PATH. Prints one JSON object with the streamed
text, finish reason and usage; the Rust test (tests/tests/vlm.rs) checks the values.
"""

import base64
import json
import sys

from openai import OpenAI

base_url, path = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
with open(path, "rb") as f:
    url = "data:image/png;base64," + base64.b64encode(f.read()).decode()
model = client.models.list().data[0].id
stream = client.chat.completions.create(
    model=model,
    messages=[
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "Describe this image."},
            ],
        }
    ],
    max_tokens=8,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage.model_dump()
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
print(json.dumps({"text": "".join(pieces), "finish_reason": finish, "usage": usage}))
