#!/usr/bin/env bash
# The cross-tenant timing probe of SECURITY.md: tenant A sends a body of many fresh
# messages; tenant B then sends the same messages, and a fresh body of the same shape.
# If the caches keyed by content were shared, B's copy of A's text would be answered
# much faster than its fresh one. Prints the median time of each, over TRIALS.
#
#   benches/cache_oracle.sh [TRIALS] [HANDOFF]
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${1:-15}
HANDOFF=${2:-target/release/handoff}
cargo build --release --quiet --bin bench-upstream -p mock-upstream
[ -x "$HANDOFF" ] || cargo build --release --quiet --bin handoff
WORK=$(mktemp -d)
PID=""
trap 'kill $(jobs -p) $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
UP=18250 PORT=18251
target/release/bench-upstream "127.0.0.1:$UP" 2>/dev/null &
printf 'listen = "127.0.0.1:%s"\ndata_dir = "%s/data"\n[upstream]\nbase_url = "http://127.0.0.1:%s"\n[compaction]\nenabled = false\n' \
  "$PORT" "$WORK" "$UP" > "$WORK/handoff.toml"
"$HANDOFF" serve --config "$WORK/handoff.toml" >/dev/null 2>"$WORK/log" &
PID=$!
python3 - "$PORT" "$TRIALS" <<'PY'
import http.client, json, statistics, sys, time, uuid

port, trials = int(sys.argv[1]), int(sys.argv[2])

def body(tag):
    # 3,000 messages of distinct text, 1.6 MB: parsing them is most of the work.
    messages = []
    for n in range(1500):
        messages.append({"role": "user", "content": f"{tag} question {n} " + "lorem ipsum " * 20})
        messages.append({"role": "assistant", "content": f"{tag} answer {n} " + "dolor sit " * 20})
    messages.append({"role": "user", "content": "and now?"})
    return json.dumps({"model": "gpt-4o", "messages": messages}).encode()

def send(key, data):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    start = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", data,
                       {"content-type": "application/json", "authorization": f"Bearer {key}"})
    answer = connection.getresponse()
    answer.read()
    elapsed = (time.perf_counter() - start) * 1000
    assert answer.status == 200, answer.status
    return elapsed

for _ in range(100):
    try:
        http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/handoff/health")
        break
    except OSError:
        time.sleep(0.1)
times = {"B sends A's text": [], "B sends a fresh text": [], "A sends its own text again": []}
for _ in range(trials):
    a_text = body(uuid.uuid4().hex)
    send("sk-tenant-a-oracle", a_text)
    times["B sends A's text"].append(send("sk-tenant-b-oracle", a_text))
    times["B sends a fresh text"].append(send("sk-tenant-b-oracle", body(uuid.uuid4().hex)))
    times["A sends its own text again"].append(send("sk-tenant-a-oracle", a_text))
for what, samples in times.items():
    print(f"{what:<28} median {statistics.median(samples):6.1f} ms  (min {min(samples):.1f}, max {max(samples):.1f})")
PY
