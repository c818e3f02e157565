"""A tool loop over the Responses API's WebSocket mode with the openai SDK
(`client.responses.connect()`): one socket, each turn `previous_response_id` and only
the new items, `store=False` (the chain held on the socket). A turn the API refuses
ends the session.

Usage: openai_socket_session.py TURNS   (HANDOFF_URL in the environment)
Prints {"requests", "turns", "died": null or the refusal, "events", "ms": per create}.
"""
import json
import os
import sys
import time

from openai import OpenAI

turns = int(sys.argv[1])
client = OpenAI(base_url=os.environ["HANDOFF_URL"] + "/v1", api_key="sk-socket-session-test",
                max_retries=0)
TOOLS = [{"type": "function", "name": "lookup", "description": "Looks a fact up.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}]
FILLER = " ".join(f"row{i} value={i * 7 % 13}" for i in range(60))

requests = 0
served = 0
events = 0
died = None
ms = []
previous = None

with client.responses.connect() as connection:
    try:
        for turn in range(1, turns + 1):
            items = [{"role": "user", "content": f"Step {turn}. Remember FACT-{turn:03d}. Then look it up. {FILLER}"}]
            while True:
                requests += 1
                kwargs = dict(model="gpt-mock", input=items, store=False, tools=TOOLS,
                              instructions="You are a meticulous agent.")
                if previous:
                    kwargs["previous_response_id"] = previous
                started = time.perf_counter()
                connection.response.create(**kwargs)
                response = None
                for event in connection:
                    events += 1
                    if event.type == "response.completed":
                        response = event.response
                        break
                    if event.type == "error":
                        raise RuntimeError(f"error event: {event.to_json()}")
                ms.append((time.perf_counter() - started) * 1000)
                previous = response.id
                calls = [item for item in response.output if item.type == "function_call"]
                if not calls:
                    break
                items = [{"type": "function_call_output", "call_id": c.call_id,
                          "output": f"Result of step {turn}: {FILLER}"} for c in calls]
            served = turn
    except RuntimeError as err:
        died = f"turn {served + 1}: {err}"

json.dump({"requests": requests, "turns": served, "died": died, "events": events, "ms": ms}, sys.stdout)
