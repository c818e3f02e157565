"""Reads streams whose final event the mock splits at a given byte offset, with the
official SDKs, through handoff.

Usage: final_event_splits.py DIALECT OFFSET...   (HANDOFF_URL in the environment)
DIALECT is chat, responses or anthropic. For each offset, one streamed request whose
user text is "split OFFSET"; prints a JSON list of what the SDK saw, one per request.
"""
import json
import os
import sys

import anthropic
from openai import OpenAI

URL = os.environ["HANDOFF_URL"]
dialect, offsets = sys.argv[1], sys.argv[2:]
openai_client = OpenAI(base_url=URL + "/v1", api_key="sk-split-test", max_retries=0)
anthropic_client = anthropic.Anthropic(base_url=URL, api_key="sk-ant-split-test", max_retries=0)

results = []
for offset in offsets:
    text = f"split {offset}"
    seen = {"offset": int(offset)}
    if dialect == "chat":
        stream = openai_client.chat.completions.create(
            model="gpt-mock", stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": text}])
        parts = []
        for chunk in stream:
            if chunk.usage is not None:
                seen["usage"] = chunk.usage.prompt_tokens
            parts.extend(c.delta.content or "" for c in chunk.choices)
        seen["text"] = "".join(parts)
    elif dialect == "responses":
        final = None
        for event in openai_client.responses.create(model="gpt-mock", input=text, stream=True):
            if event.type == "response.completed":
                final = event.response
        seen["text"] = final.output_text if final else None
        seen["usage"] = final.usage.input_tokens if final else None
    else:
        with anthropic_client.messages.stream(
                model="claude-mock", max_tokens=64,
                messages=[{"role": "user", "content": text}]) as stream:
            message = stream.get_final_message()
        seen["text"] = "".join(b.text for b in message.content if b.type == "text")
        seen["usage"] = message.usage.input_tokens
    results.append(seen)
json.dump(results, sys.stdout)
