"""The training load of a profile-guided build (scripts/pgo-build.sh): what handoff does
in production, in roughly the proportions it does it, against bench-upstream. Every
dialect's small and long bodies (the long one repeated, as an agent re-sends its
conversation), a conversation that grows past a small window and is compacted,
streams in all three dialects, and the requests that end early (malformed JSON, a
pass-through route). Exits non-zero if handoff answered a tracked request with an
error, so a broken training run never silently yields a skewed profile.

usage: pgo_train.py HOST:PORT BODIES_DIR
"""
import http.client
import json
import os
import subprocess
import sys

address, bodies = sys.argv[1], sys.argv[2]
host, port = address.rsplit(":", 1)
PATHS = {"": "/v1/chat/completions", "_anthropic": "/v1/messages", "_responses": "/v1/responses"}
failures = []


def send(connection, path, body, conversation=None, expect_ok=True):
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-train"}
    if conversation:
        headers["x-handoff-conversation-id"] = conversation
    connection.request("POST", path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    if expect_ok and response.status != 200:
        failures.append(f"{path}: {response.status}")


def repeat(path, body, count, conversation=None):
    connection = http.client.HTTPConnection(host, int(port))
    for _ in range(count):
        send(connection, path, body, conversation)
    connection.close()


for suffix, path in PATHS.items():
    small = open(os.path.join(bodies, f"small{suffix}.json"), "rb").read()
    long = open(os.path.join(bodies, f"long{suffix}.json"), "rb").read()
    repeat(path, small, 3000)
    repeat(path, long, 150, f"train-long{suffix}")

# A chat conversation growing turn by turn into a window it overflows: compaction, the
# handoff, and the view that follows it.
grown = json.load(open(os.path.join(bodies, "long.json")))
grown["model"] = "train-compact"
messages = grown["messages"]
cuts = [i + 1 for i, m in enumerate(messages) if m["role"] == "tool" and (i + 1 == len(messages) or messages[i + 1]["role"] != "tool")]
connection = http.client.HTTPConnection(host, int(port))
for cut in cuts[len(cuts) // 2 :: max(1, len(cuts) // 60)]:
    grown["messages"] = messages[:cut] + [{"role": "user", "content": "go on"}]
    send(connection, PATHS[""], json.dumps(grown).encode(), "train-compact")

# What ends early: a body that is not JSON, one that is not a chat request, and a route
# handoff passes through untouched (bench-upstream's answer to it does not matter).
for _ in range(200):
    send(connection, PATHS[""], b'{"model": "train", "messages": [', expect_ok=False)
    send(connection, PATHS[""], b'{"model": "train"}', expect_ok=False)
    connection.request("GET", "/v1/models", headers={"Authorization": "Bearer sk-train"})
    connection.getresponse().read()
connection.close()

probe = os.path.join(os.path.dirname(__file__), "..", "benches", "e2e", "stream_probe.py")
streams = [subprocess.Popen([sys.executable, probe, host, port, "4", api], stdout=subprocess.DEVNULL) for api in ("chat", "anthropic", "responses")]
if any(stream.wait() != 0 for stream in streams):
    failures.append("a stream probe failed")

# The compacting conversation must have compacted, or the profile lacks that path.
connection = http.client.HTTPConnection(host, int(port))
connection.request("GET", "/handoff/metrics")
metrics = connection.getresponse().read().decode()
compactions = sum(
    float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith("handoff_compactions_total")
)
if compactions == 0:
    failures.append("the growing conversation was never compacted")

if failures:
    sys.exit(f"training load: {len(failures)} unexpected answers, first: {failures[0]}")
