#!/usr/bin/env bash
# Bytes on disk per request for real conversations, raw and compressed: the chained
# BFCL sessions (benches/chain_sessions.py over tests/fixtures/conversations) replayed
# through a release handoff turn by turn, each request the session up to a user or
# tool message, as a client re-sends it; then every conversation compressed
# (store.compress_after) and `handoff store stats` read before and after.
#
#   benches/store_ratio.sh
set -euo pipefail
cd "$(dirname "$0")/.."
UP=${UP_PORT:-18350} PORT=${PROXY_PORT:-18351}
cargo build --release --quiet --bin handoff
cargo build --release --quiet -p mock-upstream --bin bench-upstream
HANDOFF=$PWD/target/release/handoff
WORK=$(mktemp -d /tmp/store-ratio.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
target/release/bench-upstream "127.0.0.1:$UP" 2>/dev/null &
PIDS+=($!)
python3 benches/chain_sessions.py tests/fixtures/conversations "$WORK/sessions" >/dev/null
config() {
  printf 'listen = "127.0.0.1:%s"\ndata_dir = "%s/data"\n[upstream]\nbase_url = "http://127.0.0.1:%s"\n[compaction]\nenabled = false\n%s\n' \
    "$PORT" "$WORK" "$UP" "$1" > "$WORK/handoff.toml"
}
serve() {
  "$HANDOFF" serve --config "$WORK/handoff.toml" 2>>"$WORK/log" &
  SERVE=$!
  until curl -sf "http://127.0.0.1:$PORT/handoff/health" >/dev/null; do sleep 0.05; done
}
config ""
serve
python3 - "$PORT" "$WORK/sessions" <<'PY'
import glob, http.client, json, os, sys
port, sessions = int(sys.argv[1]), sys.argv[2]
connection = http.client.HTTPConnection("127.0.0.1", port)
requests = 0
for path in sorted(glob.glob(os.path.join(sessions, "*.json"))):
    doc = json.load(open(path))
    name = os.path.basename(path)[:-5]
    messages = doc["messages"]
    for end, message in enumerate(messages):
        if message["role"] not in ("user", "tool"):
            continue
        if end + 1 < len(messages) and messages[end + 1]["role"] == "tool":
            continue  # the rest of this tool round comes in the same request
        body = json.dumps({"model": "gpt-4o", "tools": doc["tools"], "messages": messages[: end + 1]})
        connection.request("POST", "/v1/chat/completions", body, {
            "content-type": "application/json", "authorization": "Bearer sk-ratio",
            "x-handoff-conversation-id": name})
        response = connection.getresponse(); response.read()
        assert response.status == 200, response.status
        requests += 1
print(f"{requests} requests over {len(glob.glob(os.path.join(sessions, '*.json')))} sessions", file=sys.stderr)
PY
kill "$SERVE"; wait "$SERVE" 2>/dev/null || true
before=$("$HANDOFF" store stats --config "$WORK/handoff.toml" --json)
config $'[store]\ncompress_after = "1s"\nupkeep_interval = "1s"'
sleep 1.5
serve
sessions=$(ls "$WORK/sessions" | wc -l)
until [ "$(find "$WORK/data/tenants" -name messages.jsonl.zst | wc -l)" -ge "$sessions" ]; do sleep 0.5; done
kill "$SERVE"; wait "$SERVE" 2>/dev/null || true
after=$("$HANDOFF" store stats --config "$WORK/handoff.toml" --json)
python3 - "$before" "$after" <<'PY'
import json, sys
before, after = (json.loads(a)["tenants"][0] for a in sys.argv[1:3])
requests = before["requests"]
print(f"| chained BFCL sessions | {before['conversations']} | {requests} | {before['bytes_stored'] / requests:,.0f} B "
      f"| {after['bytes_stored'] / requests:,.0f} B | {before['bytes_stored'] / after['bytes_stored']:.1f}x |")
PY
