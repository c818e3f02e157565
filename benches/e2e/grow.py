"""A conversation that grows, turn by turn, as an agent sends it: the prefixes of BODY's
messages that end a tool batch, from FROM (a fraction) of its length to all of it, each
sent once, in order, on one keep-alive connection, with one conversation id. The first
is sent before the clock starts (it loads the tokenizer and counts the whole history).
Prints the requests timed and the CPU µs per request the process PID spent on them.

usage: grow.py HOST PORT BODY PID [FROM]   -> "requests cpu_us_per_request"
"""
import http.client
import json
import os
import sys
import time

host, port, path, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
start = float(sys.argv[5]) if len(sys.argv) > 5 else 0.6
body = json.load(open(path))
messages = body["messages"]
# A cut after the last result of a tool batch keeps every call answered.
cuts = [
    i + 1
    for i, m in enumerate(messages)
    if m["role"] == "tool" and (i + 1 == len(messages) or messages[i + 1]["role"] != "tool")
]
cuts = [c for c in cuts if c >= start * len(messages)]


def ticks():
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


connection = http.client.HTTPConnection(host, port)
headers = {
    "content-type": "application/json",
    "authorization": "Bearer sk-bench",
    "x-handoff-conversation-id": f"grow-{os.getpid()}",
}


def send(cut):
    connection.request("POST", "/v1/chat/completions", json.dumps(dict(body, messages=messages[:cut])), headers)
    reply = connection.getresponse()
    reply.read()
    if reply.status != 200:
        sys.exit(f"request with {cut} messages: {reply.status}")


send(cuts[0])
# GROW_PAUSE: seconds to wait here, e.g. for a profiler to attach after the warm-up.
time.sleep(float(os.environ.get("GROW_PAUSE", "0")))
before = ticks()
for cut in cuts[1:]:
    send(cut)
spent = ticks() - before
print(len(cuts) - 1, round(spent / os.sysconf("SC_CLK_TCK") * 1e6 / (len(cuts) - 1), 1))
