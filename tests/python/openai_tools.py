"""Tool calls and reasoning through the official `openai` package, unchanged: a forced
tool call whole and streamed (the streamed `delta.tool_calls` pieces concatenated), and
a tool result in the history.

Usage: openai_tools.py BASE_URL. Prints one JSON object with what it saw; the Rust test
(tests/tests/tools.rs) checks the values.
"""

import json
import sys

import jsonschema
from openai import OpenAI

base_url = sys.argv[1]
client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
model = client.models.list().data[0].id
schema = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
tools = [
    {"type": "function", "function": {"name": "get_weather",
     "description": "Current weather of a city", "parameters": schema}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
messages = [{"role": "user", "content": "What is the weather in Paris?"}]
choice = {"type": "function", "function": {"name": "get_weather"}}

whole = client.chat.completions.create(
    model=model, messages=messages, tools=tools, tool_choice=choice,
    max_tokens=80, temperature=0,
)
msg = whole.choices[0].message
call = msg.tool_calls[0]
args = json.loads(call.function.arguments)
jsonschema.validate(args, schema)

stream = client.chat.completions.create(
    model=model, messages=messages, tools=tools, tool_choice=choice,
    max_tokens=80, temperature=0, stream=True,
)
pieces = {}
finish = None
for chunk in stream:
    for c in chunk.choices:
        for tc in c.delta.tool_calls or []:
            p = pieces.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                p["id"] = tc.id
            if tc.function and tc.function.name:
                p["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                p["arguments"] += tc.function.arguments
        if c.finish_reason:
            finish = c.finish_reason

history = messages + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
    {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"},
]
answer = client.chat.completions.create(
    model=model, messages=history, tools=tools, tool_choice="none",
    max_tokens=8, temperature=0,
)

print(json.dumps({
    "finish_reason": whole.choices[0].finish_reason,
    "content": msg.content,
    "name": call.function.name,
    "id": call.id,
    "arguments": call.function.arguments,
    "stream_finish_reason": finish,
    "calls": [{"name": c.function.name, "arguments": c.function.arguments}
              for c in msg.tool_calls],
    "ids_unique": len({c.id for c in msg.tool_calls}) == len(msg.tool_calls),
    "stream_calls": [{"name": pieces[i]["name"], "arguments": pieces[i]["arguments"]}
                     for i in sorted(pieces)],
    "stream_ids": all(p["id"] for p in pieces.values()),
    "answer_finish_reason": answer.choices[0].finish_reason,
    "answer_has_text": bool(answer.choices[0].message.content),
}))
