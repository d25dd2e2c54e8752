"""Steering through the official `openai` package, unchanged: chat log-probabilities
(whole and streamed), logit_bias with penalties, completions log-probabilities, a
token-id prompt, and JSON-schema output checked by the `jsonschema` package.

Usage: openai_steering.py BASE_URL BANG_TOKEN_ID. Prints one JSON object with what it
saw; the Rust test (tests/tests/steering.rs) checks the values.
"""

import json
import sys

import jsonschema
from openai import OpenAI

base_url, bang = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
model = client.models.list().data[0].id
messages = [{"role": "user", "content": "What is the capital of France?"}]

whole = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0,
    logprobs=True, top_logprobs=3,
)
content = whole.choices[0].logprobs.content

stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0,
    logprobs=True, top_logprobs=3, stream=True,
)
stream_tokens = []
for chunk in stream:
    for choice in chunk.choices:
        if choice.logprobs is not None and choice.logprobs.content:
            stream_tokens.extend(t.token for t in choice.logprobs.content)

biased = client.chat.completions.create(
    model=model, messages=messages, max_tokens=4, temperature=0,
    logit_bias={bang: 100}, presence_penalty=0.5, frequency_penalty=0.5,
)

completion = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2,
)
token_prompt = client.completions.create(
    model=model, prompt=[504, 3575, 282, 4649], max_tokens=2, temperature=0,
)

schema = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]+$", "maxLength": 12},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 99},
        "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 24},
                      "minItems": 1, "maxItems": 3},
    },
    "required": ["city", "population_millions", "landmarks"],
    "additionalProperties": False,
}
structured = client.chat.completions.create(
    model=model, messages=messages, max_tokens=120, temperature=0,
    response_format={"type": "json_schema",
                     "json_schema": {"name": "city", "schema": schema, "strict": True}},
)
structured_text = structured.choices[0].message.content
jsonschema.validate(json.loads(structured_text), schema)

print(json.dumps({
    "structured_text": structured_text,
    "structured_finish": structured.choices[0].finish_reason,
    "whole_text": whole.choices[0].message.content,
    "whole_tokens": [t.token for t in content],
    "whole_logprobs": [t.logprob for t in content],
    "whole_top_len": len(content[0].top_logprobs),
    "stream_tokens": stream_tokens,
    "biased_text": biased.choices[0].message.content,
    "completion_tokens": completion.choices[0].logprobs.tokens,
    "completion_offsets": completion.choices[0].logprobs.text_offset,
    "token_prompt_tokens": token_prompt.usage.prompt_tokens,
}))
