"""Streams N one-turn conversations through handoff with the openai SDK, each on its
own connection, closed as soon as the SDK has read `[DONE]`: the client that used to
win the race against the reply log.

Prints, per conversation, what the client assembled: its text or its tool calls.
Usage: openai_close_after_done.py N WORKERS   (HANDOFF_URL in the environment)
"""
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def one(i):
    # A client of its own: closing it closes the connection.
    client = OpenAI(base_url=os.environ["HANDOFF_URL"] + "/v1", api_key="sk-close-test",
                    max_retries=0)
    ask = "call a tool" if i % 2 == 0 else "say hello"
    text, calls = "", {}
    stream = client.chat.completions.create(
        model="gpt-4o", tools=TOOLS, stream=True,
        messages=[{"role": "user", "content": f"conversation {i}: {ask}"}])
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                slot["arguments"] += (call.function.arguments or "") if call.function else ""
    # The stream has ended ([DONE] read): close the connection at once.
    client.close()
    return {"i": i, "text": text, "calls": [calls[k] for k in sorted(calls)]}


count, workers = int(sys.argv[1]), int(sys.argv[2])
with ThreadPoolExecutor(workers) as pool:
    results = list(pool.map(one, range(count)))
json.dump(results, sys.stdout)
