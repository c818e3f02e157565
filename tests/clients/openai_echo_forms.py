"""A tool-calling conversation whose replies are echoed back the way real clients
rebuild them, to check that handoff's log keeps one branch.

Turns cycle through three clients:
- the SDK's stream helper, echoing `get_final_completion()...message.model_dump()`;
- a plain create(), echoing `message.model_dump()` (every None included);
- a hand-rolled stream accumulator, as agents write them.
Tool arguments are re-serialised without spaces after the first turn, as opencode does.
Prints the last request's messages and the final reply.
Usage: openai_echo_forms.py TURNS   (HANDOFF_URL in the environment)
"""
import json
import os
import sys

from openai import OpenAI

from chat_turn import ask

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
client = OpenAI(base_url=os.environ["HANDOFF_URL"] + "/v1", api_key="sk-echo-test", max_retries=0)


def compact_arguments(message):
    for call in message.get("tool_calls") or []:
        call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]),
                                                   separators=(",", ":"))


def reply(messages, turn):
    mode = turn % 3
    if mode == 0:
        with client.chat.completions.stream(model="gpt-4o", messages=messages, tools=TOOLS) as s:
            message = s.get_final_completion().choices[0].message.model_dump()
    elif mode == 1:
        message = client.chat.completions.create(model="gpt-4o", messages=messages,
                                                 tools=TOOLS).choices[0].message.model_dump()
    else:
        message = ask(client, "gpt-4o", messages, TOOLS, stream=True)
    if turn > 0:
        compact_arguments(message)
    return message


turns = int(sys.argv[1])
messages = [{"role": "user", "content": "question 0: look something up"}]
requests = []
for turn in range(turns):
    requests.append(json.loads(json.dumps(messages)))
    message = reply(messages, turn)
    messages.append(message)
    if message.get("tool_calls"):
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"result {turn}"})
    else:
        messages.append({"role": "user", "content": f"question {turn + 1}: look more up"})
json.dump({"requests": requests, "messages": messages}, sys.stdout)
