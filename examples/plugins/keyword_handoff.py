#!/usr/bin/env python3
"""A handoff exec plugin: a deterministic handoff from the user's own words.

Protocol version 1 (docs/plugins.md): one JSON document on stdin, one on stdout.
It keeps the previous handoff, every user request (shortened), the tools called, and
the most frequent words, without calling any model. Configure it with:

    [compaction.strategies.keywords]
    kind = "exec"
    command = ["python3", "examples/plugins/keyword_handoff.py"]
    timeout = "10s"
"""
import collections
import json
import re
import sys


def text(message):
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def main():
    request = json.load(sys.stdin)
    if request.get("version") != 1:
        json.dump({"error": f"unsupported protocol version {request.get('version')}"}, sys.stdout)
        return
    messages = [m for unit in request["history"] for m in unit]
    users = [text(m) for m in messages if m.get("role") == "user"]
    tools = [
        call["function"]["name"]
        for m in messages
        for call in (m.get("tool_calls") or [])
        if isinstance(call, dict) and "function" in call
    ]
    words = collections.Counter(
        w for w in re.findall(r"[A-Za-z][A-Za-z0-9_-]{3,}", " ".join(users)) if not w.startswith("w")
    )
    lines = ["## Handoff (keyword plugin)"]
    if request.get("previous_handoff"):
        lines += ["### Previous handoff", request["previous_handoff"]]
    lines.append("### User requests")
    lines += [f"- {u[:300]}" for u in users]
    if tools:
        lines.append("### Tools called: " + ", ".join(sorted(set(tools))))
    lines.append("### Keywords: " + ", ".join(w for w, _ in words.most_common(12)))
    json.dump({"summary": "\n".join(lines), "usage": None}, sys.stdout)


if __name__ == "__main__":
    main()
