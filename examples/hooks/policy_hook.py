#!/usr/bin/env python3
"""An exec middleware hook (protocol version 1, docs/plugins.md): it stays up and
answers one JSON line per request line.

On a request (and a view) it refuses one whose last user message asks for the system
prompt, redacts internal host names (*.corp.example), and tags it with the number of
its messages; on a reply it tags whether the reply names a host. Standard library only.
"""
import json
import re
import sys

HOSTS = re.compile(r"\b[a-z0-9-]+\.corp\.example\b")


def text_of(message):
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def decide(request):
    messages = request["messages"]
    users = [text_of(m) for m in messages if m.get("role") == "user"]
    if users and "system prompt" in users[-1].lower():
        return {"deny": {"status": 403, "message": "this proxy does not reveal system prompts"}}
    found = sorted({h for m in messages for h in HOSTS.findall(text_of(m))})
    return {
        "redact": [{"find": host, "label": "host"} for host in found],
        "tags": {"messages": str(len(messages))},
    }


for line in sys.stdin:
    call = json.loads(line)
    if call.get("version") != 1:
        print(json.dumps({"error": f"unknown protocol version {call.get('version')}"}), flush=True)
        continue
    hook = call.get("hook")
    if hook in ("on_request", "on_view"):
        answer = decide(call["request"])
    elif hook == "on_reply":
        named = any(HOSTS.search(text_of(m)) for m in call["reply"])
        answer = {"tags": {"reply_names_host": "yes" if named else "no"}}
    else:
        answer = {}  # a stage this hook does not know: no decision
    print(json.dumps(answer), flush=True)
