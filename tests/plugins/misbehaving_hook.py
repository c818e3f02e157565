#!/usr/bin/env python3
"""An exec middleware hook that misbehaves on request, for tests/e2e/hooks.rs.

It appends its pid to the file named by its first argument when it starts. Then it
answers one line per request line, by the last user message's text: HANG (it forks a
child that sleeps, writes the child's pid too, and never answers), CRASH (exits),
GARBAGE (answers a line that is not JSON), ERROR (answers a protocol error); anything
else passes.
"""
import json
import os
import sys
import time

pids = sys.argv[1]
with open(pids, "a") as out:
    out.write(f"{os.getpid()}\n")

for line in sys.stdin:
    request = json.loads(line)["request"]
    users = [m.get("content") for m in request["messages"] if m.get("role") == "user"]
    last = users[-1] if users and isinstance(users[-1], str) else ""
    if last == "HANG":
        child = os.fork()
        if child == 0:
            time.sleep(3600)
            os._exit(0)
        with open(pids, "a") as out:
            out.write(f"{child}\n")
        time.sleep(3600)
    elif last == "CRASH":
        sys.exit(3)
    elif last == "GARBAGE":
        print("this is not json", flush=True)
    elif last == "ERROR":
        print(json.dumps({"error": "the policy service is down"}), flush=True)
    else:
        print(json.dumps({}), flush=True)
