"""Talks to handoff with the official openai SDK, streamed and not.

Reads HANDOFF_URL, prints one JSON document with what the SDK returned.
"""
import json
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ["HANDOFF_URL"] + "/v1", api_key="sk-sdk-test-key", max_retries=0)
messages = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hello."},
]

plain = client.chat.completions.create(model="gpt-4o", messages=messages, extra_body={"x_unknown": 7})
chunks = client.chat.completions.create(model="gpt-4o", messages=messages, stream=True)
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

cut_error = None
try:
    for _ in client.chat.completions.create(
        model="gpt-4o", messages=messages, stream=True, extra_headers={"x-mock-cut": "1"}
    ):
        pass
except Exception as exc:  # the SDK must see the cut as an error
    cut_error = type(exc).__name__

json.dump(
    {
        "plain": plain.choices[0].message.content,
        "finish": plain.choices[0].finish_reason,
        "streamed": streamed,
        "cut_error": cut_error,
    },
    sys.stdout,
)
