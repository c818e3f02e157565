"""Writes the benchmark request bodies into DIR: small.json (3 messages) and long.json
(about 400 KB of real tool-calling conversation from tests/fixtures)."""
import glob
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

fixtures = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "../../tests/fixtures/conversations/*.json")))
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
