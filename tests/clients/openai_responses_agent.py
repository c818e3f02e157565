"""A stateless function-calling agent through handoff with the openai SDK's Responses API.

Each turn states a fact, gets reasoning and a function_call back, answers it with a
large output, and gets an answer. Requests alternate between a streamed and a plain
`client.responses.create`, with `store=False`, so the whole input goes out each turn,
and each response's output items go back exactly as the SDK returned them, as Codex
and the Agents SDK do. Any error from the SDK fails the run.

Usage: openai_responses_agent.py STATE FIRST_TURN LAST_TURN   (HANDOFF_URL in the environment)
STATE is a JSON file with the items so far (created when missing); it is rewritten at
the end, and the run prints {"requests", "items", "replay"} with `replay` the input list
as the client would send it next.
"""
import json
import os
import sys

from openai import OpenAI

from sdk_json import plain

state_path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = OpenAI(
    base_url=os.environ["HANDOFF_URL"] + "/v1",
    api_key="sk-responses-agent-test",
    max_retries=0,
    default_headers={"x-handoff-conversation-id": "responses-agent"},
)
TOOLS = [{"type": "function", "name": "lookup", "description": "Looks a fact up.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}]
FILLER = " ".join(f"row{i} value={i * 7 % 13}" for i in range(150))

items = json.load(open(state_path)) if os.path.exists(state_path) else []
requests = 0


def ask():
    global requests
    requests += 1
    kwargs = dict(model="gpt-mock", instructions="You are a meticulous agent.", tools=TOOLS,
                  input=items, store=False, include=["reasoning.encrypted_content"])
    if requests % 2:
        for event in client.responses.create(stream=True, **kwargs):
            if event.type == "response.completed":
                return event.response
            if event.type in ("error", "response.failed"):
                raise RuntimeError(f"stream failed: {event}")
        raise RuntimeError("the stream ended without response.completed")
    return client.responses.create(**kwargs)


for turn in range(first, last + 1):
    items.append({"role": "user", "content": f"Step {turn}. Remember FACT-{turn:03d} exactly. Then look it up."})
    while True:
        response = ask()
        # The SDK's own output items go back as they are.
        items.extend(response.output)
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        for call in calls:
            items.append({"type": "function_call_output", "call_id": call.call_id,
                          "output": f"Result of step {turn}: {FILLER}"})

replay = plain(items)
json.dump(replay, open(state_path, "w"))
json.dump({"requests": requests, "items": len(replay), "replay": replay}, sys.stdout)
