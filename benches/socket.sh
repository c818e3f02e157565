#!/usr/bin/env bash
# The Responses API's WebSocket mode through handoff, on the release binary and the
# scripted model (tests/mock-upstream bin scripted-model, answering at once): the
# per-turn latency of a 30-turn tool loop (the model asks for a file, the client
# answers with its 20 KB, 30 times) over a socket and as POST + SSE, each through
# handoff and straight to the model; then the memory an open socket holds.
#
#   socket   - one socket, each turn previous_response_id and only the new items,
#              store false: through handoff (which opens a socket of its own to the
#              model, the model serving the mode) and straight to the model;
#   post     - POST /v1/responses, stream true, the whole history each turn, through
#              handoff and straight to the model.
#
#   benches/socket.sh                 # 3 loops of each, 500 idle sockets
#   LOOPS=1 SOCKETS=200 benches/socket.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MOCK_PORT=${MOCK_PORT:-18150}
PROXY_PORT=${PROXY_PORT:-18151}
LOOPS=${LOOPS:-3}
SOCKETS=${SOCKETS:-500}

cargo build --release --quiet --bin handoff -p handoff
cargo build --release --quiet --bin scripted-model -p mock-upstream
[ -x .venv/bin/python ] || { echo "run scripts/test.sh once first: it makes .venv" >&2; exit 1; }
WORK=$(mktemp -d)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
wait_port() { for _ in $(seq 1 600); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "nothing on port $1" >&2; exit 1; }

mkdir -p "$WORK/task"
SCRIPTED_SOCKETS=on target/release/scripted-model "127.0.0.1:$MOCK_PORT" 10000000 "$WORK/task" 30 > /dev/null &
PIDS+=($!)
cat > "$WORK/handoff.toml" <<TOML
listen = "127.0.0.1:$PROXY_PORT"
data_dir = "$WORK/data"
[upstream]
base_url = "http://127.0.0.1:$MOCK_PORT"
[limits]
max_connections = 4096
TOML
RUST_LOG=warn target/release/handoff serve --config "$WORK/handoff.toml" > "$WORK/handoff.log" 2>&1 &
HANDOFF=$!
PIDS+=($HANDOFF)
wait_port "$MOCK_PORT"
wait_port "$PROXY_PORT"

.venv/bin/python - "$PROXY_PORT" "$MOCK_PORT" "$LOOPS" "$SOCKETS" "$HANDOFF" "$WORK/task" <<'PY'
import http.client, json, statistics, sys, time
from websockets.sync.client import connect

proxy, mock, loops, sockets, pid, task = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
PROMPT = f"Read the files notes_01.txt to notes_30.txt in this directory one at a time, in order, with your file-reading tool, then say DONE."
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench-socket"}

def file_output(call):
    path = json.loads(call["arguments"])["cmd"].split(" ", 1)[1]
    with open(path) as f:
        return {"type": "function_call_output", "call_id": call["call_id"], "output": f.read()}

def post_loop(port, run):
    history = [{"role": "user", "content": f"run {run}. {PROMPT}"}]
    conn = http.client.HTTPConnection("127.0.0.1", int(port))
    times = []
    while True:
        body = json.dumps({"model": "scripted", "input": history, "tools": TOOLS, "store": False, "stream": True})
        started = time.perf_counter()
        conn.request("POST", "/v1/responses", body, HEADERS)
        response = conn.getresponse()
        completed = None
        for line in response.read().decode().splitlines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event.get("type") == "response.completed":
                    completed = event["response"]
        times.append((time.perf_counter() - started) * 1000)
        output = completed["output"]
        history.extend({k: v for k, v in item.items() if k not in ("id", "status")} for item in output)
        calls = [item for item in output if item["type"] == "function_call"]
        if not calls:
            return times
        history.extend(file_output(call) for call in calls)

def socket_loop(port, run):
    times = []
    with connect(f"ws://127.0.0.1:{port}/v1/responses", additional_headers=HEADERS, max_size=None) as ws:
        previous, items = None, [{"role": "user", "content": f"run {run}. {PROMPT}"}]
        while True:
            create = {"type": "response.create", "model": "scripted", "input": items, "tools": TOOLS, "store": False}
            if previous:
                create["previous_response_id"] = previous
            started = time.perf_counter()
            ws.send(json.dumps(create))
            while True:
                event = json.loads(ws.recv())
                if event["type"] == "response.completed":
                    break
                if event["type"] == "error":
                    raise SystemExit(f"error event: {event}")
            times.append((time.perf_counter() - started) * 1000)
            previous = event["response"]["id"]
            calls = [item for item in event["response"]["output"] if item["type"] == "function_call"]
            if not calls:
                return times
            items = [file_output(call) for call in calls]

def rss_kb():
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))

rows = {"socket through handoff": [], "socket direct": [], "POST + SSE through handoff": [], "POST + SSE direct": []}
for run in range(loops):
    rows["socket through handoff"] += socket_loop(proxy, run)
    rows["socket direct"] += socket_loop(mock, 3000 + run)
    rows["POST + SSE through handoff"] += post_loop(proxy, 1000 + run)
    rows["POST + SSE direct"] += post_loop(mock, 2000 + run)

def p90(values):
    return sorted(values)[int(len(values) * 0.9) - 1]

print("| path | turns | median ms | p90 ms |")
print("| --- | ---: | ---: | ---: |")
for name, times in rows.items():
    print(f"| {name} | {len(times)} | {statistics.median(times):.1f} | {p90(times):.1f} |")

before = rss_kb()
opened = [connect(f"ws://127.0.0.1:{proxy}/v1/responses", additional_headers=HEADERS) for _ in range(sockets)]
time.sleep(0.5)
after = rss_kb()
for ws in opened:
    ws.close()
print(f"\n{sockets} idle sockets: RSS {before} -> {after} KiB, {(after - before) / sockets:.1f} KiB each")
PY
