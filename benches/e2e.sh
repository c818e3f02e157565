#!/usr/bin/env bash
# End-to-end benchmark: the same mock upstream reached directly, through handoff,
# through nginx (reverse proxy, proxy_buffering off, upstream keepalive) and through
# the LiteLLM proxy, interleaved and repeated; medians and ratios are printed as a
# Markdown table. Load comes from wrk. Beside req/s and latency, the small and long
# chat tables give each proxy's CPU time per request (user + system, from
# /proc/<pid>/stat over the run, nginx's workers included): the figure that does not
# swing with the machine's load.
#
#   benches/e2e.sh [--duration SECONDS] [--rounds N] [--no-litellm] [--smoke]
#
# When PostgreSQL is installed (Debian's postgresql), a second handoff on the postgres
# store (a throwaway cluster) runs the same loads as "handoff-pg", and the database's
# statements it receives during the repeated-body runs are counted: a request that
# adds nothing new must not touch the database.
#
# Needs: wrk and nginx-light (Debian), and for LiteLLM `pip install 'litellm[proxy]'`
# in $LITELLM_VENV (default .bench-venv, created when missing). --smoke runs every step
# for one second without LiteLLM, to keep the harness from rotting (CI does this).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=10 ROUNDS=3 LITELLM=1
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --no-litellm) LITELLM=0 ;;
    --smoke) DURATION=1 ROUNDS=1 LITELLM=0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { echo "nginx is missing: apt-get install nginx-light" >&2; exit 1; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

WORK=$(mktemp -d)
PIDS=()
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
AS_PG=()
[ "$(id -u)" = 0 ] && AS_PG=(runuser -u postgres --)
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  "$NGINX" -c "$WORK/nginx.conf" -s stop 2>/dev/null || true
  [ -d "$WORK/pg/data" ] && "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$WORK/pg/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
UP=18000 HO=18001 NG=18002 LL=18003 HP=18004 PGPORT=18005

cargo build --release --quiet --bin handoff -p handoff
cargo build --release --quiet --bin bench-upstream -p mock-upstream
python3 benches/e2e/bodies.py "$WORK"

wait_port() { for _ in $(seq 1 900); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 did not open" >&2; exit 1; }

target/release/bench-upstream "127.0.0.1:$UP" 2>/dev/null & UP_PID=$!; PIDS+=($UP_PID)
cat > "$WORK/handoff.toml" <<TOML
listen = "127.0.0.1:$HO"
data_dir = "$WORK/data"
[upstream]
base_url = "http://127.0.0.1:$UP"
[log]
level = "warn"
[models."bench-model"]
context_window = 1000000
TOML
target/release/handoff serve --config "$WORK/handoff.toml" 2>"$WORK/handoff.log" & HANDOFF_PID=$!; PIDS+=($HANDOFF_PID)

PG=0
if [ -n "$PGBIN" ] && [ -x "$PGBIN/initdb" ]; then
  PG=1
  mkdir -p "$WORK/pg"; chmod 755 "$WORK"
  [ "$(id -u)" = 0 ] && chown postgres "$WORK/pg"
  "${AS_PG[@]}" "$PGBIN/initdb" -D "$WORK/pg/data" --auth=trust -U postgres >/dev/null
  "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$WORK/pg/data" -o "-p $PGPORT -k $WORK/pg -c listen_addresses=127.0.0.1" -l "$WORK/pg/log" -w start >/dev/null
  sed -e "s/127.0.0.1:$HO/127.0.0.1:$HP/" -e "s#$WORK/data#$WORK/data-pg#" "$WORK/handoff.toml" > "$WORK/handoff-pg.toml"
  printf '[store]\nbackend = "postgres"\nurl = "postgres://postgres@127.0.0.1:%s/postgres"\n' "$PGPORT" >> "$WORK/handoff-pg.toml"
  target/release/handoff serve --config "$WORK/handoff-pg.toml" 2>"$WORK/handoff-pg.log" & HP_PID=$!; PIDS+=($HP_PID)
fi
# Statement logging on or off (reloaded at once by every session): while it is on, the
# server log has one line per statement handoff sends.
pg_log_statements() { "${AS_PG[@]}" "$PGBIN/psql" -h 127.0.0.1 -p "$PGPORT" -U postgres -qAtc "ALTER SYSTEM SET log_statement = '$1'" -c "SELECT pg_reload_conf()" >/dev/null; sleep 0.5; }

mkdir -p "$WORK/nginx"
cat > "$WORK/nginx.conf" <<NGINX
worker_processes auto;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx; proxy_temp_path $WORK/nginx;
  fastcgi_temp_path $WORK/nginx; uwsgi_temp_path $WORK/nginx; scgi_temp_path $WORK/nginx;
  client_max_body_size 64m;
  upstream mock { server 127.0.0.1:$UP; keepalive 64; }
  server {
    listen 127.0.0.1:$NG;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      tcp_nodelay on;
    }
  }
}
NGINX
"$NGINX" -c "$WORK/nginx.conf"

if [ "$LITELLM" = 1 ]; then
  VENV=${LITELLM_VENV:-.bench-venv}
  [ -x "$VENV/bin/litellm" ] || { python3 -m venv "$VENV"; "$VENV/bin/pip" install --quiet 'litellm[proxy]'; }
  cat > "$WORK/litellm.yaml" <<YAML
model_list:
  - model_name: bench-model
    litellm_params: {model: openai/bench-model, api_base: "http://127.0.0.1:$UP/v1", api_key: sk-bench}
general_settings:
  master_key: sk-bench
YAML
  LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/litellm" --config "$WORK/litellm.yaml" --host 127.0.0.1 --port "$LL" --num_workers 1 >"$WORK/litellm.log" 2>&1 & LL_PID=$!; PIDS+=($LL_PID)
fi
for port in $UP $HO $NG; do wait_port "$port"; done
if [ "$PG" = 1 ]; then wait_port "$HP"; fi
if [ "$LITELLM" = 1 ]; then wait_port "$LL"; fi
sleep 1
IDLE_RSS=$(ps -o rss= -p "$HANDOFF_PID")

# CPU time (clock ticks, user + system) of a process and its children: nginx's
# workers are its master's children; a proxy's threads are counted in its own.
cpu_ticks() { # pid
  local total=0 pid fields
  for pid in "$1" $(pgrep -P "$1" 2>/dev/null || true); do
    [ -r "/proc/$pid/stat" ] || continue
    # The fields after "pid (comm) ": utime and stime are the 12th and 13th.
    fields=$(sed 's/^.*) //' "/proc/$pid/stat")
    total=$(( total + $(echo "$fields" | awk '{print $12 + $13}') ))
  done
  echo "$total"
}

# The process whose CPU a target's requests cost: the proxy's own (the upstream's for
# direct, which every row also pays).
target_pid() {
  case "$1" in
    direct) echo "$UP_PID" ;;
    handoff) echo "$HANDOFF_PID" ;;
    handoff-pg) echo "${HP_PID:-}" ;;
    nginx) cat "$WORK/nginx.pid" ;;
    litellm) echo "${LL_PID:-}" ;;
  esac
}

# wrk → "rps p50_ms p99_ms non2xx cpu_us_per_request"
run_wrk() { # url connections body [conversation [target]]
  local out threads=$(( $2 < 2 ? $2 : 2 )) pid before after
  pid=$(target_pid "${5:-}")
  before=$([ -n "$pid" ] && cpu_ticks "$pid" || echo 0)
  out=$(BODY="$3" CONVERSATION="${4:-}" wrk -t"$threads" -c"$2" -d"${DURATION}s" --timeout 10s --latency -s benches/e2e/post.lua "$1")
  after=$([ -n "$pid" ] && cpu_ticks "$pid" || echo 0)
  python3 - "$out" "$((after - before))" "$(getconf CLK_TCK)" <<'PY'
import re, sys
text, ticks, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def ms(v):
    n, unit = float(re.match(r"[\d.]+", v).group()), re.sub(r"[\d.]", "", v)
    return n * {"us": 0.001, "ms": 1, "s": 1000, "m": 60000}[unit]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
p = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", text, re.M))
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
requests = int(re.search(r"(\d+) requests in", text).group(1))
cpu_us = ticks / hz * 1e6 / requests if requests and ticks else float("nan")
print(rps, ms(p["50"]), ms(p["99"]), errors.group(1) if errors else 0, f"{cpu_us:.1f}")
PY
}

TARGETS=(direct handoff nginx)
[ "$LITELLM" = 1 ] && TARGETS+=(litellm)
[ "$PG" = 1 ] && TARGETS+=(handoff-pg)
REPEATED=(direct handoff nginx)
[ "$PG" = 1 ] && REPEATED+=(handoff-pg)
declare -A PORT=([direct]=$UP [handoff]=$HO [nginx]=$NG [litellm]=$LL [handoff-pg]=$HP)
RESULTS="$WORK/results.txt"
if [ "$PG" = 1 ]; then
  # Warm both conversations once, so the runs below repeat what the store has.
  for body in small long; do
    curl -s -o /dev/null -H 'content-type: application/json' -H "x-handoff-conversation-id: bench-$body" \
      -H 'authorization: Bearer sk-bench' --data-binary "@$WORK/$body.json" "http://127.0.0.1:$HP/v1/chat/completions"
  done
  curl -s -o /dev/null -H 'content-type: application/json' -H 'authorization: Bearer sk-bench' \
    --data-binary "@$WORK/small.json" "http://127.0.0.1:$HP/v1/chat/completions"
  pg_log_statements all
  PG_LOG_FROM=$(stat -c %s "$WORK/pg/log")
fi
for round in $(seq 1 "$ROUNDS"); do
  for target in "${TARGETS[@]}"; do
    echo "small $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/chat/completions" 32 "$WORK/small.json" "" "$target")" >> "$RESULTS"
  done
  for target in "${REPEATED[@]}"; do
    echo "long $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/chat/completions" 8 "$WORK/long.json" bench-long "$target")" >> "$RESULTS"
  done
  for target in direct handoff nginx; do
    echo "stream $target $(python3 benches/e2e/stream_probe.py 127.0.0.1 "${PORT[$target]}" 3)" >> "$RESULTS"
  done
  # What a single agent feels: one connection, one request at a time.
  for target in "${REPEATED[@]}"; do
    echo "c1 $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/chat/completions" 1 "$WORK/small.json")" >> "$RESULTS"
  done
  # The same shapes on Anthropic's Messages API.
  for target in direct handoff nginx; do
    echo "asmall $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/messages" 32 "$WORK/small_anthropic.json" "" "$target")" >> "$RESULTS"
    echo "along $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/messages" 8 "$WORK/long_anthropic.json" bench-long-anthropic "$target")" >> "$RESULTS"
    echo "astream $target $(python3 benches/e2e/stream_probe.py 127.0.0.1 "${PORT[$target]}" 3 anthropic)" >> "$RESULTS"
  done
done

PG_TX=""
if [ "$PG" = 1 ]; then
  pg_log_statements none
  PG_STATEMENTS=$(tail -c +"$((PG_LOG_FROM + 1))" "$WORK/pg/log" | grep -E 'LOG:  (statement|execute)' | grep -vcE 'ALTER SYSTEM|pg_reload_conf' || true)
  PG_REQUESTS=$(grep -E '^(small|long|c1) handoff-pg ' "$RESULTS" | wc -l)
  PG_TX="$PG_STATEMENTS statements sent to the database during $PG_REQUESTS repeated-body wrk runs on handoff-pg"
  # The write path: every request a new conversation, so every request appends.
  for round in $(seq 1 "$ROUNDS"); do
    for target in handoff handoff-pg; do
      out=$(wrk -t2 -c32 -d"${DURATION}s" --latency -s benches/e2e/appends.lua "http://127.0.0.1:${PORT[$target]}/v1/chat/completions")
      echo "appends $target $(python3 -c 'import re,sys; t=sys.argv[1]; print(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))' "$out")" >> "$RESULTS"
    done
  done
fi
LOADED_RSS=$(ps -o rss= -p "$HANDOFF_PID")
COUNT=10000 wrk -t2 -c32 -d"$((DURATION < 5 ? DURATION : 5))s" -s benches/e2e/conversations.lua "http://127.0.0.1:$HO" >/dev/null
FULL_RSS=$(ps -o rss= -p "$HANDOFF_PID")
TRACKED=$(find "$WORK/data/tenants" -mindepth 3 -maxdepth 3 -type d | wc -l)
OVERHEAD=$(curl -s "http://127.0.0.1:$HO/handoff/metrics" | grep -E '^handoff_overhead_seconds_(sum|count)' | tr '\n' ' ')

python3 - "$RESULTS" "$IDLE_RSS" "$FULL_RSS" "$TRACKED" "$OVERHEAD" "$DURATION" "$ROUNDS" "$LOADED_RSS" "$PG_TX" <<'PY'
import json, statistics, sys
path, idle, full, tracked, overhead, duration, rounds, loaded, pg_tx = sys.argv[1:10]
rows = {}
for line in open(path):
    kind, target, rest = line.split(" ", 2)
    rows.setdefault((kind, target), []).append(rest.strip())
med = lambda xs: statistics.median(xs) if xs else float("nan")
def wrk(kind, target):
    vals = [list(map(float, r.split())) for r in rows.get((kind, target), [])]
    return [med([v[i] for v in vals if len(v) > i]) for i in range(5)] if vals else None
print(f"Medians of {rounds} interleaved round(s) of {duration}s each.\n")
print("| small chat, 32 conn | req/s | p50 ms | p99 ms | non-2xx | CPU µs/request |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
small = {t: wrk("small", t) for t in ["direct", "handoff", "handoff-pg", "nginx", "litellm"]}
for t, v in small.items():
    if v: print(f"| {t} | {v[0]:.0f} | {v[1]:.3f} | {v[2]:.3f} | {v[3]:.0f} | {v[4]:.0f} |")
h, n, l = small["handoff"], small["nginx"], small["litellm"]
print(f"\nhandoff/nginx throughput: {h[0]/n[0]:.2f}×" + (f"; handoff/LiteLLM throughput: {h[0]/l[0]:.0f}×" if l else ""))
print("\n| tracked long conversation (~400 KB), 8 conn | req/s | p50 ms | p99 ms | CPU µs/request |")
print("| --- | ---: | ---: | ---: | ---: |")
long = {t: wrk("long", t) for t in ["direct", "handoff", "handoff-pg", "nginx"]}
for t, v in long.items():
    if v: print(f"| {t} | {v[0]:.0f} | {v[1]:.3f} | {v[2]:.3f} | {v[4]:.0f} |")
print(f"\nhandoff p50 added over nginx (long): {long['handoff'][1] - long['nginx'][1]:.3f} ms")
print("\n| streaming (64 deltas, 20 ms apart) | TTFB p50 ms | gap p50 ms | gap max ms |")
print("| --- | ---: | ---: | ---: |")
stream = {}
for t in ["direct", "handoff", "nginx"]:
    got = [json.loads(r) for r in rows.get(("stream", t), [])]
    if got:
        stream[t] = [med([g[k] for g in got]) for k in ("ttfb_p50_ms", "gap_p50_ms", "gap_max_ms")]
        print(f"| {t} | {stream[t][0]:.2f} | {stream[t][1]:.2f} | {stream[t][2]:.2f} |")
print(f"\nTTFB added by handoff over direct: {stream['handoff'][0] - stream['direct'][0]:.2f} ms")
print("\n| small chat, 1 connection | req/s | p50 ms | p99 ms |")
print("| --- | ---: | ---: | ---: |")
c1 = {t: wrk("c1", t) for t in ["direct", "handoff", "handoff-pg", "nginx"]}
for t, v in c1.items():
    if v: print(f"| {t} | {v[0]:.0f} | {v[1]:.3f} | {v[2]:.3f} |")
print(f"\nc=1 latency added by handoff over direct: p50 {c1['handoff'][1] - c1['direct'][1]:.3f} ms, p99 {c1['handoff'][2] - c1['direct'][2]:.3f} ms"
      f" (nginx: p50 {c1['nginx'][1] - c1['direct'][1]:.3f} ms, p99 {c1['nginx'][2] - c1['direct'][2]:.3f} ms)")
print("\n| Anthropic Messages | small req/s (32 conn) | small p50 ms | long req/s (8 conn) | long p50 ms | non-2xx | stream TTFB p50 ms |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
anthropic = {}
for t in ["direct", "handoff", "nginx"]:
    s_, l_ = wrk("asmall", t), wrk("along", t)
    got = [json.loads(r) for r in rows.get(("astream", t), [])]
    ttfb = med([g["ttfb_p50_ms"] for g in got]) if got else float("nan")
    if s_ and l_:
        anthropic[t] = (s_, l_, ttfb)
        print(f"| {t} | {s_[0]:.0f} | {s_[1]:.3f} | {l_[0]:.0f} | {l_[1]:.3f} | {s_[3] + l_[3]:.0f} | {ttfb:.2f} |")
if "handoff" in anthropic and "nginx" in anthropic:
    h, n = anthropic["handoff"], anthropic["nginx"]
    print(f"\nAnthropic: handoff/nginx small throughput {h[0][0]/n[0][0]:.2f}×; long p50 added over nginx {h[1][1] - n[1][1]:.3f} ms; TTFB added over direct {h[2] - anthropic['direct'][2]:.2f} ms")
print(f"\nhandoff RSS: idle {int(idle)/1024:.1f} MB; after the load runs {int(loaded)/1024:.1f} MB; with {tracked.strip()} tracked conversations {int(full)/1024:.1f} MB")
if pg_tx:
    print(f"\npostgres store: {pg_tx}")
    appends = {t: med([float(r) for r in rows.get(("appends", t), [])]) for t in ["handoff", "handoff-pg"]}
    print(f"\nnew conversation per request (every request appends), 32 conn: disk {appends['handoff']:.0f} req/s, postgres {appends['handoff-pg']:.0f} req/s")
print(f"\noverhead metric: {overhead}")
PY
