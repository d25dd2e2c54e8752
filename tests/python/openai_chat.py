"""Drives inferd's OpenAI-compatible API with the official `openai` package, unchanged.

Usage: openai_chat.py BASE_URL API_KEY. Prints one JSON object with what it saw; the
Rust test (tests/tests/http_api.rs) checks the values.
"""

import json
import sys

import openai
from openai import OpenAI

base_url, api_key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
messages = [{"role": "user", "content": "What is the capital of France?"}]

model = client.models.list().data[0].id

stream = client.chat.completions.create(
    model=model,
    messages=messages,
    max_tokens=24,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, roles, finish, usage, ids, objects = [], [], None, None, set(), set()
for chunk in stream:
    ids.add(chunk.id)
    objects.add(chunk.object)
    if chunk.usage is not None:
        usage = chunk.usage.model_dump()
    for choice in chunk.choices:
        if choice.delta.role:
            roles.append(choice.delta.role)
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason

whole = client.chat.completions.create(
    model=model, messages=messages, max_tokens=24, temperature=0
)

completion = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=8, temperature=0
)

try:
    OpenAI(base_url=base_url, api_key="wrong-key", max_retries=0).models.list()
    wrong_key = "accepted"
except openai.AuthenticationError as e:
    wrong_key = e.status_code

try:
    client.chat.completions.create(model=model, messages=messages, temperature=500)
    bad_value = None
except openai.BadRequestError as e:
    bad_value = {"status": e.status_code, "body": e.body}

print(
    json.dumps(
        {
            "model": model,
            "stream_text": "".join(pieces),
            "stream_chunks": len(pieces),
            "stream_roles": roles,
            "stream_finish_reason": finish,
            "stream_usage": usage,
            "stream_ids": sorted(ids),
            "stream_objects": sorted(objects),
            "whole_text": whole.choices[0].message.content,
            "whole_finish_reason": whole.choices[0].finish_reason,
            "whole_usage": whole.usage.model_dump(),
            "completion_text": completion.choices[0].text,
            "wrong_key": wrong_key,
            "bad_value": bad_value,
        }
    )
)
