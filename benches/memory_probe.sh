#!/usr/bin/env bash
# The memory probe of SECURITY.md: BODIES chat requests, each one assistant turn of
# 1,500 tool calls with distinct 2 KB ids and their answers (~6.2 MB a body, 620 MB for
# the default 100), sent to a release handoff with its default memory budgets
# (store.cache_bytes, store.message_cache_bytes); prints its RSS before and after.
#
#   benches/memory_probe.sh [BODIES] [HANDOFF]
set -euo pipefail
cd "$(dirname "$0")/.."
BODIES=${1:-100}
HANDOFF=${2:-target/release/handoff}
cargo build --release --quiet --bin bench-upstream -p mock-upstream
[ -x "$HANDOFF" ] || cargo build --release --quiet --bin handoff
WORK=$(mktemp -d)
PID=""
trap 'kill $(jobs -p) $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
UP=18240 PORT=18241
target/release/bench-upstream "127.0.0.1:$UP" 2>/dev/null &
printf 'listen = "127.0.0.1:%s"\ndata_dir = "%s/data"\n[upstream]\nbase_url = "http://127.0.0.1:%s"\n[compaction]\nenabled = false\n' \
  "$PORT" "$WORK" "$UP" > "$WORK/handoff.toml"
"$HANDOFF" serve --config "$WORK/handoff.toml" >/dev/null 2>"$WORK/log" &
PID=$!
python3 - "$PORT" "$PID" "$BODIES" <<'PY'
import http.client, json, sys, time

port, pid, bodies = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0

def body(n):
    ids = [f"call_{n}_{c}_".ljust(2048, "x") for c in range(1500)]
    calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]
    answers = [{"role": "tool", "tool_call_id": i, "content": "ok"} for i in ids]
    messages = [{"role": "user", "content": f"run {n}"},
                {"role": "assistant", "content": None, "tool_calls": calls}] + answers
    return json.dumps({"model": "gpt-4o", "messages": messages}).encode()

for _ in range(100):
    try:
        http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/handoff/health")
        break
    except OSError:
        time.sleep(0.1)
start = rss()
sent = 0
for n in range(bodies):
    data = body(n)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.request("POST", "/v1/chat/completions", data,
                       {"content-type": "application/json", "authorization": "Bearer sk-probe"})
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 200, answer.status
    sent += len(data)
    if n in (0, 9) or (n + 1) % 100 == 0:
        print(f"after {n + 1:>3} bodies ({sent >> 20} MiB sent): RSS {rss()} MiB")
print(f"RSS {start} MiB idle, {rss()} MiB after {sent >> 20} MiB of distinct tool ids")
PY
