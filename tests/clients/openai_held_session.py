"""A stateful Responses tool loop with the openai SDK: each turn sends only its new
items, the rest held by the server, chained by `previous_response_id` (MODE
`previous_response_id`) or over a conversation the SDK creates (MODE `conversation`),
streamed, `store=True`. A turn the API refuses ends the session, as it ends an app's.

Usage: openai_held_session.py MODE TURNS   (HANDOFF_URL in the environment: handoff,
or the upstream itself)
Prints {"requests", "turns", "died": null or the refusal, "conversation": its id}.
"""
import json
import os
import sys

import openai
from openai import OpenAI

mode, turns = sys.argv[1], int(sys.argv[2])
client = OpenAI(base_url=os.environ["HANDOFF_URL"] + "/v1", api_key="sk-held-session-test",
                max_retries=0)
TOOLS = [{"type": "function", "name": "lookup", "description": "Looks a fact up.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}]
FILLER = " ".join(f"row{i} value={i * 7 % 13}" for i in range(60))

conversation = f"conv_held_{os.getpid()}" if mode == "conversation" else None
previous = None
requests = 0
served = 0
died = None


def create(items):
    global requests, previous
    requests += 1
    kwargs = dict(model="gpt-mock", instructions="You are a meticulous agent.", tools=TOOLS,
                  input=items, store=True)
    if conversation:
        kwargs["conversation"] = conversation
    elif previous:
        kwargs["previous_response_id"] = previous
    with client.responses.stream(**kwargs) as stream:
        response = stream.get_final_response()
    previous = response.id
    return response


try:
    for turn in range(1, turns + 1):
        items = [{"role": "user", "content": f"Step {turn}. Remember FACT-{turn:03d}. Then look it up. {FILLER}"}]
        while True:
            response = create(items)
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                break
            items = [{"type": "function_call_output", "call_id": c.call_id,
                      "output": f"Result of step {turn}: {FILLER}"} for c in calls]
        served = turn
except openai.APIError as err:
    died = f"turn {served + 1}: {err}"

json.dump({"requests": requests, "turns": served, "died": died, "conversation": conversation},
          sys.stdout)
