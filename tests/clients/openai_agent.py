"""Drives a long tool-calling conversation through handoff with the openai SDK.

Every other request is streamed. Prints the final request's messages and the last
reply as JSON, so the test can compare them with `handoff audit replay`.
Usage: openai_agent.py REQUESTS   (HANDOFF_URL in the environment)
"""
import json
import os
import sys

from openai import OpenAI

from chat_turn import ask

requests = int(sys.argv[1])
client = OpenAI(base_url=os.environ["HANDOFF_URL"] + "/v1", api_key="sk-agent-secret-key", max_retries=0)
messages = [{"role": "system", "content": "You are an agent. Today is day 1."}]
turn = 0




TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
reply = None
for i in range(requests):
    if reply is None or "tool_calls" not in reply:
        turn += 1
        messages.append({"role": "user", "content": f"question {turn}: what is {turn} squared?"})
    else:
        for call in reply["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"result {turn * turn}"})
    # Agents often rewrite their system prompt every turn; the conversation must hold.
    messages[0] = {"role": "system", "content": f"You are an agent. Today is day {i + 1}."}
    final_request = json.loads(json.dumps(messages))
    reply = ask(client, "gpt-4o", messages, TOOLS, stream=i % 2 == 1)
    messages.append(reply)

json.dump({"request": final_request, "reply": reply}, sys.stdout)
