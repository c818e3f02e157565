"""A stateless Responses agent that lets the provider compact, with the openai SDK.

MODE `context_management`: every request asks the server to compact past a threshold
(`context_management=[{"type": "compaction", "compact_threshold": N}]`); when an
output carries a compaction item, the client drops every item before it, as OpenAI's
compaction guide suggests. MODE `compact`: every third turn the client calls
`client.responses.compact` and carries its `output` forward as its whole history.
Requests alternate between streamed and plain; `store=False`; the SDK's own output
items go back exactly as it returned them. Any SDK error fails the run.

Usage: openai_native_compaction.py MODE TURNS THRESHOLD [REPEAT]   (HANDOFF_URL in the environment)
Prints {"requests", "compactions", "replay", "sent"}: `replay` is the input of the last
request, `sent` the input of each, in order.
"""
import json
import os
import sys

from openai import OpenAI

from sdk_json import plain

mode, turns, threshold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# How many times each tool result repeats the filler: past a 50,000-token trigger in few turns.
repeat = int(sys.argv[4]) if len(sys.argv) > 4 else 1
client = OpenAI(
    base_url=os.environ["HANDOFF_URL"] + "/v1",
    api_key="sk-native-compaction-test",
    max_retries=0,
)
TOOLS = [{"type": "function", "name": "lookup", "description": "Looks a fact up.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}]
FILLER = " ".join(f"row{i} value={i * 7 % 13}" for i in range(150 * repeat))

items = []
requests = 0
compactions = 0
last_input = []
sent = []


def ask():
    global requests, last_input
    requests += 1
    last_input = plain(items)
    sent.append(last_input)
    kwargs = dict(model="gpt-mock", instructions="You are a meticulous agent.", tools=TOOLS,
                  input=items, store=False)
    if mode == "context_management":
        kwargs["context_management"] = [{"type": "compaction", "compact_threshold": threshold}]
    if requests % 2:
        for event in client.responses.create(stream=True, **kwargs):
            if event.type == "response.completed":
                return event.response
            if event.type in ("error", "response.failed"):
                raise RuntimeError(f"stream failed: {event}")
        raise RuntimeError("the stream ended without response.completed")
    return client.responses.create(**kwargs)


def take(output):
    """Adds a response's output; from its compaction item on, when it has one."""
    global items, compactions
    kept = list(output)
    marks = [i for i, item in enumerate(kept) if item.type == "compaction"]
    if marks:
        compactions += 1
        items = kept[marks[-1]:]
    else:
        items.extend(kept)


for turn in range(1, turns + 1):
    if mode == "compact" and turn % 3 == 0:
        requests += 1
        last_input = plain(items)
        sent.append(last_input)
        compacted = client.responses.compact(model="gpt-mock", input=items,
                                             instructions="You are a meticulous agent.")
        items = list(compacted.output)
        compactions += 1
    items.append({"role": "user", "content": f"Step {turn}. Remember FACT-{turn:03d} exactly. Then look it up."})
    while True:
        response = ask()
        take(response.output)
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        for call in calls:
            items.append({"type": "function_call_output", "call_id": call.call_id,
                          "output": f"Result of step {turn}: {FILLER}"})

json.dump({"requests": requests, "compactions": compactions, "replay": last_input, "sent": sent},
          sys.stdout)
