"""A tool_use agent through handoff with the official anthropic SDK.

Each turn states a fact, gets a tool_use back, answers it with a large tool_result,
and gets an answer. Requests alternate between messages.create and messages.stream,
and each reply's content goes back exactly as the SDK returned it, as real agents do.
Any error from the SDK fails the run.

Usage: anthropic_agent.py STATE FIRST_TURN LAST_TURN   (HANDOFF_URL in the environment)
STATE is a JSON file with the messages so far (created when missing); it is rewritten
at the end, and the run prints {"requests", "messages", "replay"} with `replay` the
message list as the client would send it next.
"""
import json
import os
import sys

import anthropic

from sdk_json import plain

state_path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = anthropic.Anthropic(
    base_url=os.environ["HANDOFF_URL"],
    api_key="sk-ant-agent-test",
    max_retries=0,
    default_headers={"x-handoff-conversation-id": "claude-agent"},
)
TOOLS = [{"name": "lookup", "description": "Looks a fact up.", "input_schema": {"type": "object"}}]
SYSTEM = [{"type": "text", "text": "You are a meticulous agent.", "cache_control": {"type": "ephemeral"}}]
FILLER = " ".join(f"row{i} value={i * 7 % 13}" for i in range(150))

messages = json.load(open(state_path)) if os.path.exists(state_path) else []
requests = 0


def ask():
    global requests
    requests += 1
    kwargs = dict(model="claude-mock", max_tokens=512, system=SYSTEM, tools=TOOLS, messages=messages)
    if requests % 2:
        with client.messages.stream(**kwargs) as stream:
            return stream.get_final_message()
    return client.messages.create(**kwargs)


for turn in range(first, last + 1):
    messages.append({"role": "user", "content": f"Step {turn}. Remember FACT-{turn:03d} exactly. Then look it up."})
    while True:
        reply = ask()
        # The SDK's own objects go back as they are: what every Claude agent loop does.
        messages.append({"role": "assistant", "content": reply.content})
        calls = [block for block in reply.content if block.type == "tool_use"]
        if not calls:
            break
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": f"Result of step {turn}: {FILLER}"}
            for call in calls
        ]})

replay = plain(messages)
json.dump(replay, open(state_path, "w"))
json.dump({"requests": requests, "messages": len(replay), "replay": replay}, sys.stdout)
