#!/usr/bin/env bash
# The latency a served compaction adds, against the same compaction done inline, on
# the release binary and the scripted model (tests/mock-upstream bin scripted-model)
# run without the APIs' own compaction (SCRIPTED_NATIVE=off), answering at once, its
# summaries too: what is measured is handoff's own work and the client's round trips.
#
# Each run is a fresh conversation of the same history (six items of about 2,500
# tokens, 15k in all):
#   served - the history and a trailing compaction_trigger (handoff compacts with the
#            strategy chain and answers a sealed handle), then the request that goes
#            on from it (handoff opens the handle and sends what it stands for);
#   inline - the history sent to a 12k model: handoff compacts it on the way and
#            sends the view.
# Prints the median and p90 milliseconds of each, and the difference of the medians.
#
#   benches/served.sh            # 40 runs of each
#   RUNS=10 benches/served.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MOCK_PORT=${MOCK_PORT:-18140}
PROXY_PORT=${PROXY_PORT:-18141}
RUNS=${RUNS:-40}

cargo build --release --quiet --bin handoff -p handoff
cargo build --release --quiet --bin scripted-model -p mock-upstream
WORK=$(mktemp -d)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
wait_port() { for _ in $(seq 1 600); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "nothing on port $1" >&2; exit 1; }

mkdir -p "$WORK/task"
SCRIPTED_NATIVE=off target/release/scripted-model "127.0.0.1:$MOCK_PORT" 1000000 "$WORK/task" > /dev/null &
PIDS+=($!)
cat > "$WORK/handoff.toml" <<TOML
listen = "127.0.0.1:$PROXY_PORT"
data_dir = "$WORK/data"
[upstream]
base_url = "http://127.0.0.1:$MOCK_PORT"
native_compaction = "serve"
[models."served"]
context_window = 40000
tokenizer = "estimate"
[models."inline"]
context_window = 12000
tokenizer = "estimate"
[compaction]
prepare_at = 0
TOML
RUST_LOG=warn target/release/handoff serve --config "$WORK/handoff.toml" > "$WORK/handoff.log" 2>&1 &
PIDS+=($!)
wait_port "$MOCK_PORT"
wait_port "$PROXY_PORT"

python3 - "$PROXY_PORT" "$RUNS" <<'PY'
import json, statistics, sys, time, urllib.request

port, runs = sys.argv[1], int(sys.argv[2])
url = f"http://127.0.0.1:{port}/v1/responses"
filler = " ".join(f"line{i} holds value {i * 7919 % 10007}" for i in range(1300))

def post(conversation, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "content-type": "application/json", "authorization": "Bearer sk-bench-served",
        "x-handoff-conversation-id": conversation})
    start = time.perf_counter()
    with urllib.request.urlopen(request) as response:
        answer = json.load(response)
    return (time.perf_counter() - start) * 1000, answer

def user(text):
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

def history(run):
    items = [user("fix the failing test")]
    for turn in range(6):
        items.append(user(f"run {run} FACT-{turn:03d} {filler}"))
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "noted"}]})
    return items

served, inline = [], []
for run in range(runs):
    items = history(run)
    ms, answer = post(f"served-{run}", {"model": "served", "input": items + [{"type": "compaction_trigger"}], "store": False})
    item = answer["output"][0]
    assert item["type"] == "compaction", answer
    item = {"type": "compaction", "encrypted_content": item["encrypted_content"]}
    then, answer = post(f"served-{run}", {"model": "served", "input": [items[0], item, user("go on")], "store": False})
    assert answer.get("output"), answer
    served.append(ms + then)
    ms, answer = post(f"inline-{run}", {"model": "inline", "input": items + [user("go on")], "store": False})
    assert answer.get("output"), answer
    inline.append(ms)

def p90(values):
    return sorted(values)[int(len(values) * 0.9) - 1]

print("| path | median ms | p90 ms |")
print("| --- | ---: | ---: |")
print(f"| served: the trigger answered, then the request that goes on | {statistics.median(served):.1f} | {p90(served):.1f} |")
print(f"| inline: compacted on the way | {statistics.median(inline):.1f} | {p90(inline):.1f} |")
print(f"\nadded by serving (medians): {statistics.median(served) - statistics.median(inline):.1f} ms over {runs} runs")
PY
