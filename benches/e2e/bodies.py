"""Writes the benchmark request bodies into DIR: small.json (3 messages) and long.json
(about 400 KB of real tool-calling conversation from tests/fixtures), and the same two
in Anthropic's Messages shape (*_anthropic.json) and the Responses API's
(*_responses.json)."""
import json
import os
import sys

out = sys.argv[1]
small = {"model": "bench-model", "messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
]}
small["messages"].append({"role": "user", "content": "And of Italy?"})
small["messages"] = small["messages"][:3]
json.dump(small, open(os.path.join(out, "small.json"), "w"))

# The six fixtures `mock_upstream::fixtures` stitches for the cargo benches, named: a
# glob took every fixture in the folder, and once all 46 were vendored one pass over
# them made a 718 KB body, not the ~400 KB (620 messages) the hot-path figures are on.
FIXTURES = (1, 10, 120, 160, 190, 60)
fixtures = [os.path.join(os.path.dirname(__file__), f"../../tests/fixtures/conversations/bfcl_multi_turn_long_context_{n}.json")
            for n in FIXTURES]
messages, size, round_ = [{"role": "system", "content": "You are a careful agent."}], 0, 0
tools = json.load(open(fixtures[0]))["tools"]
while size < 400_000:
    for path in fixtures:
        for message in json.load(open(path))["messages"]:
            if message["role"] == "system":
                continue
            if "tool_call_id" in message:
                message["tool_call_id"] += f"-r{round_}"
            for call in message.get("tool_calls") or []:
                call["id"] += f"-r{round_}"
            messages.append(message)
            size += len(json.dumps(message))
        messages.append({"role": "assistant", "content": f"done with part {round_}"})
        round_ += 1
messages.append({"role": "user", "content": "Summarise where we are."})
json.dump({"model": "bench-model", "messages": messages, "tools": tools}, open(os.path.join(out, "long.json"), "w"))

# The same two bodies in Anthropic's Messages shape: system top-level, tool_use and
# tool_result blocks, roles alternating.
def blocks(message):
    content = message.get("content")
    out = []
    if isinstance(content, str) and content:
        out.append({"type": "text", "text": content})
    elif isinstance(content, list):
        out += [{"type": "text", "text": p.get("text", "")} for p in content if p.get("text")]
    for call in message.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            arguments = {"raw": call["function"]["arguments"]}
        if not isinstance(arguments, dict):
            arguments = {"value": arguments}
        out.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments})
    return out


def to_anthropic(body):
    system, turns = [], []
    for message in body["messages"]:
        role = message["role"]
        if role == "system":
            system.append(message["content"])
            continue
        if role == "tool":
            role, content = "user", [{"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": str(message.get("content") or "")}]
        else:
            content = blocks(message)
        if not content:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += content
        else:
            turns.append({"role": role, "content": content})
    out = {"model": "bench-model", "max_tokens": 1024, "system": "\n".join(system), "messages": turns}
    if body.get("tools"):
        out["tools"] = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                         "input_schema": t["function"].get("parameters", {"type": "object"})} for t in body["tools"]]
    return out


small_anthropic = to_anthropic(small)
small_anthropic["messages"].append({"role": "user", "content": "And of Italy?"})
json.dump(small_anthropic, open(os.path.join(out, "small_anthropic.json"), "w"))
json.dump(to_anthropic({"messages": messages, "tools": tools}), open(os.path.join(out, "long_anthropic.json"), "w"))


# And in the Responses API's shape: instructions top-level, messages as input items,
# tool calls as function_call items answered by function_call_output items.
def to_responses(body):
    instructions, items = [], []
    for message in body["messages"]:
        role, content = message["role"], message.get("content")
        if role == "system":
            instructions.append(content)
            continue
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"], "output": str(content or "")})
            continue
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])
        if text:
            items.append({"role": role, "content": text})
        for call in message.get("tool_calls") or []:
            items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                          "arguments": call["function"]["arguments"] or "{}"})
    out = {"model": "bench-model", "instructions": "\n".join(instructions), "input": items, "store": False}
    if body.get("tools"):
        out["tools"] = [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description", ""),
                         "parameters": t["function"].get("parameters", {"type": "object"})} for t in body["tools"]]
    return out


json.dump(to_responses(small), open(os.path.join(out, "small_responses.json"), "w"))
json.dump(to_responses({"messages": messages, "tools": tools}), open(os.path.join(out, "long_responses.json"), "w"))
