"""A 40-turn tool-calling agent through handoff with the openai SDK, in a 16k window.

Each turn states a fact, calls a tool, gets a large tool result back, and gets an
answer; odd turns stream. Any error from the SDK fails the run. Prints a JSON summary.
Usage: openai_compacting_agent.py TURNS   (HANDOFF_URL in the environment)
"""
import json
import os
import sys

from openai import OpenAI

from chat_turn import ask

turns = int(sys.argv[1])
client = OpenAI(
    base_url=os.environ["HANDOFF_URL"] + "/v1",
    api_key="sk-compacting-agent",
    max_retries=0,
    default_headers={"x-handoff-conversation-id": "agent40"},
)
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
messages = [{"role": "system", "content": "You are a meticulous agent."}]
FILLER = " ".join(f"row{i} value={i * 7 % 13}" for i in range(300))




requests = 0
for turn in range(1, turns + 1):
    messages.append({"role": "user", "content": f"Step {turn}. Remember FACT-{turn:03d} exactly. Then look it up."})
    while True:
        reply = ask(client, "strict-16k", messages, TOOLS, stream=requests % 2 == 1)
        requests += 1
        messages.append(reply)
        if "tool_calls" not in reply:
            break
        for call in reply["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"Result of step {turn}: {FILLER}"})

json.dump({"turns": turns, "requests": requests, "messages": len(messages)}, sys.stdout)
