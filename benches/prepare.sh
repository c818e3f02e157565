#!/usr/bin/env bash
# Zero-wait compaction measured: one agent session of 20 turns (about 450 tokens each,
# each agent turn answered in 1 s, its tool calls answered too) through the real
# release binary, on an 8k-window model whose summaries take 3 s or 20 s (the in-repo
# mock summariser, tests/mock-upstream bin mock-summarizer, delaying each call), with
# preparation at compaction.prepare_at = 0.8 (the default) and 0.5, and off (0). Prints a Markdown table of the client's
# request latencies (p50, p99, max; the compacting requests are the tail), how many
# requests took longer than the summariser, the compactions and the summary calls.
# TURNS and TURN_SECS change the session.
#
#   benches/prepare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MOCK_PORT=18110
PROXY_PORT=18111
TURNS=${TURNS:-20}
TURN_SECS=${TURN_SECS:-1}

cargo build --release --quiet --bin handoff -p handoff
cargo build --release --quiet --bin mock-summarizer -p mock-upstream
WORK=$(mktemp -d)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap 'cleanup; rm -rf "$WORK"' EXIT
wait_port() { for _ in $(seq 1 600); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "nothing on port $1" >&2; exit 1; }

echo "| summariser | preparation | requests | p50 ms | p99 ms | max ms | requests slower than the summariser | compactions | summary calls |"
echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for delay in 3 20; do
  for prepare in 0.8 0.5 0; do
    target/release/mock-summarizer "127.0.0.1:$MOCK_PORT" "$delay" "$TURN_SECS" > /dev/null &
    PIDS=($!)
    wait_port "$MOCK_PORT"
    DATA="$WORK/data-$delay-$prepare"
    cat > "$WORK/handoff.toml" <<TOML
listen = "127.0.0.1:$PROXY_PORT"
data_dir = "$DATA"
[upstream]
base_url = "http://127.0.0.1:$MOCK_PORT"
[models."strict"]
context_window = 8192
[models."strict-16k"]
context_window = 16384
[compaction]
strategy = "summarize"
summary_model = "strict-16k"
prepare_at = $prepare
summary_timeout = "60s"
TOML
    target/release/handoff serve --config "$WORK/handoff.toml" 2> "$WORK/handoff.log" &
    PIDS+=($!)
    wait_port "$PROXY_PORT"
    python3 - "$PROXY_PORT" "$TURNS" "$delay" "$prepare" "$DATA" <<'PY'
import glob, json, sys, time, urllib.request
port, turns, delay, prepare, data = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
messages = [{"role": "system", "content": "be brief"}]
latencies = []
def ask():
    body = json.dumps({"model": "strict", "messages": messages}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
        {"content-type": "application/json", "authorization": "Bearer sk-bench", "x-handoff-conversation-id": "bench"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=120) as answer:
        reply = json.load(answer)["choices"][0]["message"]
    latencies.append((time.monotonic() - started) * 1000)
    return reply
for n in range(turns):
    words = " ".join(f"w{i}" for i in range(225))
    messages.append({"role": "user", "content": f"FACT-{n:03} {words}"})
    reply = ask()
    while reply.get("tool_calls"):
        messages.append(reply)
        for call in reply["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
        reply = ask()
    messages.append(reply)
# Let a preparation still running end, so its summary call is counted.
time.sleep(delay + 1)
records = [json.loads(line) for path in glob.glob(f"{data}/tenants/*/conversations/bench/compactions.jsonl") for line in open(path)]
calls = sum(a.get("calls") or 1 for r in records for a in r["attempts"] if a["strategy"] == "summarize")
ordered = sorted(latencies)
pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
slow = sum(1 for l in latencies if l >= delay * 1000)
label = f"prepare_at = {prepare}" if prepare != "0" else "off (prepare_at = 0)"
print(f"| {delay:.0f} s | {label} | {len(latencies)} | {pick(0.5):.1f} | {pick(0.99):.1f} | {max(latencies):.1f} | {slow} | {len(records)} | {calls} |")
PY
    cleanup
  done
done
