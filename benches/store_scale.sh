#!/usr/bin/env bash
# The retained log at scale: fills a release handoff, through its chat endpoint, with
# CONVERSATIONS conversations of TURNS requests over TENANTS callers (40,000 x 25 =
# 1,000,000 requests by default), on the disk store, PostgreSQL, or both; then
# restarts it and measures what an operator meets:
#   ready    spawn to the first 200 of /handoff/health
#   rss      idle RSS two seconds after start
#   page     GET /handoff/conversations (first page, 50), first after the restart
#   timeline GET /handoff/conversations/{id}/timeline of a conversation not read since
#            the restart (after one other timeline: the first one in a process also
#            loads the tokenizer, about 170 ms once, reported apart)
#   list     handoff audit list --tenant T --json (one tenant's conversations)
#   continue one more turn of the oldest conversation, first after the restart
#   stats    handoff store stats, and the bytes it reports
# On the disk store it then compresses every conversation (store.compress_after) and
# measures again. Page-cache drops are tried before the cold figures (root only).
#
#   benches/store_scale.sh [disk|postgres|both]
#   CONVERSATIONS=2000 TURNS=25 benches/store_scale.sh disk   # a quick run
# KEEP=1 keeps the work folder (its path is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
CONVERSATIONS=${CONVERSATIONS:-40000}
TURNS=${TURNS:-25}
TENANTS=${TENANTS:-20}
STORES=${1:-both}
UP=${UP_PORT:-18340} PORT=${PROXY_PORT:-18341} PG_PORT=${PG_PORT:-18342}
cargo build --release --quiet --bin handoff
cargo build --release --quiet -p mock-upstream --bin bench-upstream
HANDOFF=$PWD/target/release/handoff
WORK=$(mktemp -d /tmp/store-scale.XXXXXX)
chmod 755 "$WORK"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ -d "$WORK/pg" ]; then runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$WORK/pg" -m immediate stop >/dev/null 2>&1 || true; fi
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
target/release/bench-upstream "127.0.0.1:$UP" 2>/dev/null &
PIDS+=($!)

drop_caches() {
  sync
  if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then echo "page cache dropped"; else echo "page cache NOT dropped (not root, or a container)"; fi
}

config() { # $1: store section
  printf 'listen = "127.0.0.1:%s"\ndata_dir = "%s/data"\n[upstream]\nbase_url = "http://127.0.0.1:%s"\n%s\n' \
    "$PORT" "$WORK" "$UP" "$1" > "$WORK/handoff.toml"
}

serve() { # starts handoff, prints the seconds to ready; sets HANDOFF_PID
  python3 - "$HANDOFF" "$WORK/handoff.toml" "$PORT" "$WORK/serve.log" <<'PY'
import subprocess, sys, time, urllib.request
handoff, config, port, log = sys.argv[1:5]
started = time.time()
child = subprocess.Popen([handoff, "serve", "--config", config], stdout=subprocess.DEVNULL,
                         stderr=open(log, "a"), start_new_session=True)
while True:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/handoff/health", timeout=1).read()
        break
    except OSError:
        if child.poll() is not None:
            sys.exit(f"handoff exited: see {log}")
        time.sleep(0.002)
print(f"{time.time() - started:.3f} {child.pid}")
PY
}

stop() { kill -TERM "$HANDOFF_PID"; while kill -0 "$HANDOFF_PID" 2>/dev/null; do sleep 0.1; done; }

timed_get() { # path -> seconds
  curl -s -o /dev/null -w '%{time_total}' "http://127.0.0.1:$PORT$1"
}

measure() { # $1: label
  local label=$1 ready
  drop_caches
  read -r ready HANDOFF_PID < <(serve)
  sleep 2
  local rss
  rss=$(awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$HANDOFF_PID/status")
  local tenant
  tenant=$("$HANDOFF" audit list --config "$WORK/handoff.toml" --json 2>/dev/null | head -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["tenant"])')
  drop_caches
  local page page2 first timeline timeline2
  page=$(timed_get "/handoff/conversations")
  page2=$(timed_get "/handoff/conversations")
  first=$(timed_get "/handoff/conversations/s$((CONVERSATIONS / 2))/timeline")
  timeline=$(timed_get "/handoff/conversations/s$((CONVERSATIONS / 2 + 1))/timeline")
  timeline2=$(timed_get "/handoff/conversations/s$((CONVERSATIONS / 2 + 1))/timeline")
  local list_start list_end listed
  list_start=$(date +%s.%N)
  listed=$("$HANDOFF" audit list --config "$WORK/handoff.toml" --tenant "$tenant" --json | wc -l)
  list_end=$(date +%s.%N)
  local continued
  continued=$(python3 - "$HANDOFF" "$WORK/handoff.toml" "$PORT" "$TENANTS" <<'PY'
import http.client, json, subprocess, sys, time
handoff, config, port, tenants = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
replay = subprocess.run([handoff, "audit", "replay", "s0", "--config", config],
                        capture_output=True, check=True).stdout
history = json.loads(replay)
history.append({"role": "user", "content": "one more turn, much later"})
body = json.dumps({"model": "bench-model", "messages": history})
connection = http.client.HTTPConnection("127.0.0.1", port)
started = time.time()
connection.request("POST", "/v1/chat/completions", body, {
    "content-type": "application/json", "authorization": "Bearer sk-scale-tenant-000",
    "x-handoff-conversation-id": "s0"})
response = connection.getresponse(); response.read()
assert response.status == 200, response.status
print(f"{(time.time() - started) * 1000:.1f}")
PY
)
  local stats_start stats_end stats
  stats_start=$(date +%s.%N)
  stats=$("$HANDOFF" store stats --config "$WORK/handoff.toml" --json)
  stats_end=$(date +%s.%N)
  stop
  python3 - "$label" "$ready" "$rss" "$page" "$page2" "$first" "$timeline" "$timeline2" \
    "$(echo "$list_end - $list_start" | bc)" "$listed" "$continued" \
    "$(echo "$stats_end - $stats_start" | bc)" "$stats" <<'PY'
import json, sys
(label, ready, rss, page, page2, first, timeline, timeline2, list_s, listed, continued, stats_s, stats) = sys.argv[1:14]
tenants = json.loads(stats)["tenants"]
total = lambda k: sum(t[k] for t in tenants)
requests = total("requests")
print(f"| {label} | {float(ready)*1000:.0f} ms | {rss} MB | {float(page)*1000:.0f} ms ({float(page2)*1000:.0f} warm) "
      f"| {float(timeline)*1000:.0f} ms ({float(timeline2)*1000:.0f} warm; {float(first)*1000:.0f} the process's first) | {float(list_s):.2f} s ({listed}) "
      f"| {continued} ms | {float(stats_s):.1f} s | {total('conversations')} / {requests} "
      f"| {total('bytes_raw')/2**30:.2f} GiB / {total('bytes_stored')/2**30:.2f} GiB "
      f"| {total('bytes_stored')/max(requests,1):.0f} B |")
PY
}

header() {
  echo "| store | ready | idle RSS | first page | timeline (cold) | audit list --tenant | continue oldest | stats | conversations / requests | raw / stored | stored per request |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
}

fill() { # $1: label
  read -r _ HANDOFF_PID < <(serve)
  echo "filling $1: $CONVERSATIONS conversations x $TURNS requests, $TENANTS tenants" >&2
  python3 benches/store_fill.py "$PORT" "$CONVERSATIONS" "$TURNS" "$TENANTS" >&2
  stop
}

ROWS=()
if [ "$STORES" = disk ] || [ "$STORES" = both ]; then
  config ""
  fill disk
  du -sb "$WORK/data" >&2
  ROWS+=("$(measure disk)")
  # Every conversation compressed, then measured again.
  config $'[store]\ncompress_after = "1s"\nupkeep_interval = "1s"'
  read -r _ HANDOFF_PID < <(serve)
  started=$(date +%s)
  while [ "$(find "$WORK/data/tenants" -name messages.jsonl.zst | wc -l)" -lt "$CONVERSATIONS" ]; do sleep 2; done
  echo "compressed $CONVERSATIONS conversations in $(( $(date +%s) - started )) s" >&2
  stop
  du -sb "$WORK/data" >&2
  config ""
  ROWS+=("$(measure "disk, compressed")")
fi
if [ "$STORES" = postgres ] || [ "$STORES" = both ]; then
  PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  mkdir -p "$WORK/pg" && chown postgres:postgres "$WORK/pg"
  runuser -u postgres -- "$PG_BIN/initdb" -D "$WORK/pg" --auth=trust -U postgres --no-sync -E UTF8 >/dev/null
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$WORK/pg" -o "-p $PG_PORT -k /tmp -c shared_buffers=256MB" -w -l "$WORK/pg/server.log" start >/dev/null
  config "$(printf '[store]\nbackend = "postgres"\nurl = "postgres://postgres@127.0.0.1:%s/postgres"\n' "$PG_PORT")"
  fill postgres
  ROWS+=("$(measure postgres)")
  echo "database size: $(runuser -u postgres -- "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -At -c "SELECT pg_size_pretty(pg_database_size('postgres'))")" >&2
fi
header
printf '%s\n' "${ROWS[@]}"
