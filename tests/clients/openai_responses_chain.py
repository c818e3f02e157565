"""A stateful Responses chain (previous_response_id) through handoff with the openai SDK.

Usage: openai_responses_chain.py   (HANDOFF_URL in the environment)
Prints {"first", "second", "text"}: the two response ids and the final text.
"""
import json
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ["HANDOFF_URL"] + "/v1", api_key="sk-chain-test", max_retries=0)
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
first = client.responses.create(model="gpt-mock", input="Look up FACT-777.", tools=TOOLS)
call = next(item for item in first.output if item.type == "function_call")
second = client.responses.create(
    model="gpt-mock",
    previous_response_id=first.id,
    input=[{"type": "function_call_output", "call_id": call.call_id, "output": "777 is lucky"}],
    tools=TOOLS,
)
json.dump({"first": first.id, "second": second.id, "text": second.output_text}, sys.stdout)
