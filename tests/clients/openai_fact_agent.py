"""A tool-calling agent whose tool results carry facts, driven through handoff with the
openai SDK, to measure how many facts a compacted conversation keeps.

Each turn: a user question, a tool call, a tool result of about WORDS words whose
first and last lines (its edges) and middle each carry one `FACT-xxxxxx`, and an
answer. Every other turn is streamed. Prints every fact, the edge facts, and how many
requests were made.
Usage: openai_fact_agent.py TURNS WORDS [MODEL]   (HANDOFF_URL in the environment)
"""
import json
import os
import random
import sys

from openai import OpenAI

from chat_turn import ask

turns, words = int(sys.argv[1]), int(sys.argv[2])
model = sys.argv[3] if len(sys.argv) > 3 else "agent-16k"
rng = random.Random(7)
client = OpenAI(base_url=os.environ["HANDOFF_URL"] + "/v1", api_key="sk-fact-agent", max_retries=0)
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
messages = [{"role": "system", "content": "You are a research agent. Record every fact you look up."}]
facts, edges, requests = [], [], 0


def fact():
    text = "FACT-%06x" % rng.randrange(16 ** 6)
    facts.append(text)
    return text


def tool_result(turn):
    first, middle, last = fact(), fact(), fact()
    edges.extend([first, last])
    rows = [f"row {i}: " + " ".join(f"v{turn}x{i}x{j}" for j in range(10)) for i in range(words // 12)]
    rows.insert(len(rows) // 2, f"{middle} is in the middle of record {turn}")
    return "\n".join([f"{first} opens record {turn}", *rows, f"{last} closes record {turn}"])


for turn in range(turns):
    messages.append({"role": "user", "content": f"question {turn}: look up record {turn}"})
    while True:
        reply = ask(client, model, messages, TOOLS, stream=turn % 2 == 1)
        requests += 1
        messages.append(reply)
        if not reply.get("tool_calls"):
            break
        for call in reply["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": tool_result(turn)})

json.dump({"facts": facts, "edge_facts": edges, "requests": requests}, sys.stdout)
