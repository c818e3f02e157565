"""Chains the real conversations that share one tool set into long sessions, as
tests/real_sessions.rs does: the first file's messages, then every later file's
without its system messages, in file-name order.

usage: chain_sessions.py CONVERSATIONS_DIR OUT_DIR
"""

import glob
import json
import os
import sys

source, out = sys.argv[1], sys.argv[2]
groups = {}
for path in sorted(glob.glob(os.path.join(source, "*.json"))):
    with open(path) as f:
        doc = json.load(f)
    key = json.dumps(doc["tools"], sort_keys=True, separators=(",", ":"))
    groups.setdefault(key, []).append(doc)
os.makedirs(out, exist_ok=True)
index = 0
for key in sorted(groups):
    files = groups[key]
    if len(files) < 2:
        continue
    messages = []
    for n, doc in enumerate(files):
        messages.extend(m for m in doc["messages"] if n == 0 or m["role"] != "system")
    with open(os.path.join(out, f"session_{index:02}.json"), "w") as f:
        json.dump({"tools": files[0]["tools"], "messages": messages}, f)
    index += 1
print(index)
