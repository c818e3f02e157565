#!/usr/bin/env bash
# End-to-end benchmark: the same mock upstream reached directly, through handoff,
# through nginx (reverse proxy, proxy_buffering off, upstream keepalive), through the
# Portkey gateway (@portkey-ai/gateway, Node) and through the LiteLLM proxy, interleaved
# and repeated, for chat completions, Anthropic Messages and Responses bodies; medians and ratios are printed as a
# Markdown table. Load comes from wrk. Beside req/s and latency, every wrk table gives
# each proxy's CPU time per request (user + system, from /proc/<pid>/stat over the
# run, nginx's workers included): the figure that does not swing with the machine's
# load.
#
#   benches/e2e.sh [--duration SECONDS] [--rounds N] [--no-litellm] [--no-portkey] [--smoke]
#                  [--handoff PATH]
#
# --handoff runs every handoff row on that binary (e.g. the profile-guided build of
# scripts/pgo-build.sh) instead of target/release/handoff, which then runs beside them
# as "handoff-plain" (chat rows), so one run compares the two builds.
#
# "handoff-w1" is the same handoff with `workers = 1` (one current-thread runtime), and
# "handoff-ws" with `workers = 0` (one work-stealing runtime), on the chat rows: the
# default is one worker per core; on a box it shares with wrk and the mock, one thread
# spends the least CPU per request.
#
# "floor" is bench-floor: handoff's threading shape (one current-thread runtime and
# SO_REUSEPORT listener per core, a pooled client each) on hyper and tokio, doing
# nothing else. It is the least a proxy on handoff's stack spends; what handoff spends
# above it is handoff's own work.
#
# When the real agents of tests/agents are installed (scripts/test.sh does it), one more
# table sends Claude Code's first request, captured by benches/e2e/capture_agent.py, to
# direct, handoff, nginx and the floor: the tool list and system prompt an agent
# re-sends every turn, which the synthetic bodies lack.
#
# When PostgreSQL is installed (Debian's postgresql), a second handoff on the postgres
# store (a throwaway cluster) runs the same loads as "handoff-pg", and the database's
# statements it receives during the repeated-body runs are counted: a request that
# adds nothing new must not touch the database.
#
# Needs: wrk and nginx-light (Debian), and for LiteLLM `pip install 'litellm[proxy]'`
# in $LITELLM_VENV (default .bench-venv, created when missing); for Portkey, node and
# npm (the gateway is installed into $PORTKEY_DIR, default .bench-portkey). --smoke runs
# every step for one second without LiteLLM and Portkey, on the debug build, to keep
# the harness from rotting (CI does this).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=10 ROUNDS=3 LITELLM=1 PORTKEY=1 HANDOFF='' PROFILE=release
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --no-litellm) LITELLM=0 ;;
    --no-portkey) PORTKEY=0 ;;
    --smoke) DURATION=1 ROUNDS=1 LITELLM=0 PORTKEY=0 PROFILE=dev ;;
    --handoff) HANDOFF=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# A smoke run judges no number: the debug build the tests made serves it, and CI
# builds no release.
BIN=target/release
[ "$PROFILE" = dev ] && BIN=target/debug
HANDOFF=${HANDOFF:-$BIN/handoff}
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
UP=18000 HO=18001 NG=18002 LL=18003 HP=18004 PGPORT=18005 PK=18006 HW=18007 HS=18008 HF=18009 HX=18010
command -v node >/dev/null || PORTKEY=0

cargo build --profile "$PROFILE" --quiet --bin handoff -p handoff
cargo build --profile "$PROFILE" --quiet --bin bench-upstream --bin bench-floor -p mock-upstream
python3 benches/e2e/bodies.py "$WORK"
# A real agent's request, when scripts/test.sh has installed the agents: Claude Code's
# first request (its 48 KB of tools and 29 KB of system prompt re-sent every turn).
AGENT=0
if [ -x tests/agents/node_modules/.bin/claude ] && [ -x tests/agents/node_modules/.bin/codex ] &&
  python3 benches/e2e/capture_agent.py "$WORK" >/dev/null 2>&1; then
  AGENT=1
fi

wait_port() { for _ in $(seq 1 900); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 did not open" >&2; exit 1; }

"$BIN/bench-upstream" "127.0.0.1:$UP" 2>/dev/null & UP_PID=$!; PIDS+=($UP_PID)
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
"$HANDOFF" serve --config "$WORK/handoff.toml" 2>"$WORK/handoff.log" & HANDOFF_PID=$!; PIDS+=($HANDOFF_PID)
{ echo "workers = 1"; sed -e "s/127.0.0.1:$HO/127.0.0.1:$HW/" -e "s#$WORK/data#$WORK/data-w1#" "$WORK/handoff.toml"; } > "$WORK/handoff-w1.toml"
"$HANDOFF" serve --config "$WORK/handoff-w1.toml" 2>"$WORK/handoff-w1.log" & HW_PID=$!; PIDS+=($HW_PID)
{ echo "workers = 0"; sed -e "s/127.0.0.1:$HO/127.0.0.1:$HS/" -e "s#$WORK/data#$WORK/data-ws#" "$WORK/handoff.toml"; } > "$WORK/handoff-ws.toml"
"$HANDOFF" serve --config "$WORK/handoff-ws.toml" 2>"$WORK/handoff-ws.log" & HS_PID=$!; PIDS+=($HS_PID)
PLAIN=0
if [ "$HANDOFF" != "$BIN/handoff" ]; then
  PLAIN=1
  sed -e "s/127.0.0.1:$HO/127.0.0.1:$HX/" -e "s#$WORK/data#$WORK/data-plain#" "$WORK/handoff.toml" > "$WORK/handoff-plain.toml"
  "$BIN/handoff" serve --config "$WORK/handoff-plain.toml" 2>"$WORK/handoff-plain.log" & HX_PID=$!; PIDS+=($HX_PID)
fi
"$BIN/bench-floor" "127.0.0.1:$HF" "http://127.0.0.1:$UP" "$(nproc)" & HF_PID=$!; PIDS+=($HF_PID)

PG=0
if [ -n "$PGBIN" ] && [ -x "$PGBIN/initdb" ]; then
  PG=1
  mkdir -p "$WORK/pg"; chmod 755 "$WORK"
  [ "$(id -u)" = 0 ] && chown postgres "$WORK/pg"
  "${AS_PG[@]}" "$PGBIN/initdb" -D "$WORK/pg/data" --auth=trust -U postgres >/dev/null
  "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$WORK/pg/data" -o "-p $PGPORT -k $WORK/pg -c listen_addresses=127.0.0.1" -l "$WORK/pg/log" -w start >/dev/null
  sed -e "s/127.0.0.1:$HO/127.0.0.1:$HP/" -e "s#$WORK/data#$WORK/data-pg#" "$WORK/handoff.toml" > "$WORK/handoff-pg.toml"
  printf '[store]\nbackend = "postgres"\nurl = "postgres://postgres@127.0.0.1:%s/postgres"\n' "$PGPORT" >> "$WORK/handoff-pg.toml"
  "$HANDOFF" serve --config "$WORK/handoff-pg.toml" 2>"$WORK/handoff-pg.log" & HP_PID=$!; PIDS+=($HP_PID)
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
if [ "$PORTKEY" = 1 ]; then
  PKDIR=${PORTKEY_DIR:-.bench-portkey}
  [ -f "$PKDIR/node_modules/@portkey-ai/gateway/build/start-server.js" ] ||
    npm install --prefix "$PKDIR" --no-audit --no-fund --loglevel=error @portkey-ai/gateway@1.15.2 >/dev/null
  NODE_ENV=production node "$PKDIR/node_modules/@portkey-ai/gateway/build/start-server.js" --port="$PK" --headless >"$WORK/portkey.log" 2>&1 & PK_PID=$!; PIDS+=($PK_PID)
fi
for port in $UP $HO $HW $HS $HF $NG; do wait_port "$port"; done
if [ "$PORTKEY" = 1 ]; then wait_port "$PK"; fi
if [ "$PG" = 1 ]; then wait_port "$HP"; fi
if [ "$PLAIN" = 1 ]; then wait_port "$HX"; fi
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
    handoff-w1) echo "$HW_PID" ;;
    handoff-ws) echo "$HS_PID" ;;
    handoff-plain) echo "${HX_PID:-}" ;;
    floor) echo "$HF_PID" ;;
    nginx) cat "$WORK/nginx.pid" ;;
    litellm) echo "${LL_PID:-}" ;;
    portkey) echo "${PK_PID:-}" ;;
  esac
}

# The headers that route a request through Portkey to the mock, per API.
portkey_headers() { # api
  local provider=openai
  [ "$1" = anthropic ] && provider=anthropic
  echo "x-portkey-provider: $provider;x-portkey-custom-host: http://127.0.0.1:$UP/v1;x-api-key: sk-bench;anthropic-version: 2023-06-01"
}

# wrk → "rps p50_ms p99_ms non2xx cpu_us_per_request"
run_wrk() { # url connections body [conversation [target [api]]]
  local out threads=$(( $2 < 2 ? $2 : 2 )) pid before after headers=""
  pid=$(target_pid "${5:-}")
  [ "${5:-}" = portkey ] && headers=$(portkey_headers "${6:-chat}")
  before=$([ -n "$pid" ] && cpu_ticks "$pid" || echo 0)
  out=$(BODY="$3" CONVERSATION="${4:-}" HEADERS="$headers" wrk -t"$threads" -c"$2" -d"${DURATION}s" --timeout 10s --latency -s benches/e2e/post.lua "$1")
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

PEERS=(direct handoff nginx)
[ "$PORTKEY" = 1 ] && PEERS+=(portkey)
TARGETS=("${PEERS[@]}" handoff-w1 handoff-ws floor)
[ "$PLAIN" = 1 ] && TARGETS+=(handoff-plain)
[ "$LITELLM" = 1 ] && TARGETS+=(litellm)
[ "$PG" = 1 ] && TARGETS+=(handoff-pg)
REPEATED=("${PEERS[@]}" handoff-w1 handoff-ws floor)
[ "$PLAIN" = 1 ] && REPEATED+=(handoff-plain)
[ "$PG" = 1 ] && REPEATED+=(handoff-pg)
declare -A PORT=([direct]=$UP [handoff]=$HO [nginx]=$NG [litellm]=$LL [handoff-pg]=$HP [portkey]=$PK [handoff-w1]=$HW [handoff-ws]=$HS [floor]=$HF [handoff-plain]=$HX)
RESULTS="$WORK/results.txt"
# Every handoff sends each body once before the runs, with the conversation id the runs
# use: the runs then repeat what the store has, and the first request's one-off work
# (the tokenizer's tables, the first count, the first append) is out of every row's
# p99 alike. A cold start is its own figure: see BENCHMARKS.md.
warm() { # port
  local body path id
  local bodies=(small long small_anthropic long_anthropic small_responses long_responses)
  if [ "$AGENT" = 1 ]; then bodies+=(claude_agent_anthropic); fi
  for body in "${bodies[@]}"; do
    case "$body" in
      *anthropic) path=/v1/messages ;;
      *responses) path=/v1/responses ;;
      *) path=/v1/chat/completions ;;
    esac
    id=""
    case "$body" in
      long) id=bench-long ;;
      long_anthropic) id=bench-long-anthropic ;;
      long_responses) id=bench-long-responses ;;
      claude_agent_anthropic) id=bench-agent ;;
    esac
    # The headers post.lua sends, so the runs land in the same tenant.
    curl -s -o /dev/null -H 'content-type: application/json' -H 'authorization: Bearer sk-bench' \
      ${id:+-H "x-handoff-conversation-id: $id"} --data-binary "@$WORK/$body.json" "http://127.0.0.1:$1$path"
  done
}
warm "$HO"
warm "$HW"
warm "$HS"
if [ "$PLAIN" = 1 ]; then warm "$HX"; fi
if [ "$PG" = 1 ]; then
  warm "$HP"
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
    echo "c1 $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/chat/completions" 1 "$WORK/small.json" "" "$target")" >> "$RESULTS"
    echo "c1long $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/chat/completions" 1 "$WORK/long.json" bench-long "$target")" >> "$RESULTS"
  done
  # The same shapes on Anthropic's Messages API and on the Responses API.
  for target in "${PEERS[@]}"; do
    echo "asmall $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/messages" 32 "$WORK/small_anthropic.json" "" "$target" anthropic)" >> "$RESULTS"
    echo "along $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/messages" 8 "$WORK/long_anthropic.json" bench-long-anthropic "$target" anthropic)" >> "$RESULTS"
    echo "rsmall $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/responses" 32 "$WORK/small_responses.json" "" "$target" responses)" >> "$RESULTS"
    echo "rlong $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/responses" 8 "$WORK/long_responses.json" bench-long-responses "$target" responses)" >> "$RESULTS"
  done
  if [ "$AGENT" = 1 ]; then
    for target in "${PEERS[@]}" floor; do
      echo "agent $target $(run_wrk "http://127.0.0.1:${PORT[$target]}/v1/messages" 8 "$WORK/claude_agent_anthropic.json" bench-agent "$target" anthropic)" >> "$RESULTS"
    done
  fi
  for target in direct handoff nginx; do
    echo "astream $target $(python3 benches/e2e/stream_probe.py 127.0.0.1 "${PORT[$target]}" 3 anthropic)" >> "$RESULTS"
    echo "rstream $target $(python3 benches/e2e/stream_probe.py 127.0.0.1 "${PORT[$target]}" 3 responses)" >> "$RESULTS"
  done
done

PG_TX=""
if [ "$PG" = 1 ]; then
  pg_log_statements none
  PG_STATEMENTS=$(tail -c +"$((PG_LOG_FROM + 1))" "$WORK/pg/log" | grep -E 'LOG:  (statement|execute)' | grep -vcE 'ALTER SYSTEM|pg_reload_conf' || true)
  PG_REQUESTS=$(grep -E '^(small|long|c1|c1long) handoff-pg ' "$RESULTS" | wc -l)
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
ALL = ["direct", "handoff", "handoff-w1", "handoff-ws", "handoff-plain", "handoff-pg", "floor", "nginx", "portkey", "litellm"]
def table(title, kind, errors=False):
    got = {t: wrk(kind, t) for t in ALL}
    got = {t: v for t, v in got.items() if v}
    print(f"\n| {title} | req/s | p50 ms | p99 ms |" + (" non-2xx |" if errors else "") + " CPU µs/request |")
    print("| --- | ---: | ---: | ---: |" + (" ---: |" if errors else "") + " ---: |")
    for t, v in got.items():
        print(f"| {t} | {v[0]:.0f} | {v[1]:.3f} | {v[2]:.3f} |" + (f" {v[3]:.0f} |" if errors else "") + f" {v[4]:.0f} |")
    return got
def ratios(label, got):
    for name in ("handoff", "handoff-w1", "handoff-ws", "handoff-plain"):
        h, n = got.get(name), got.get("nginx")
        if not (h and n):
            continue
        line = f"\n{label}: {name}/nginx throughput {h[0]/n[0]:.2f}×, p50 added over nginx {h[1] - n[1]:.3f} ms, CPU per request {h[4]:.0f} µs (nginx {n[4]:.0f})"
        if got.get("floor"):
            line += f", {h[4] - got['floor'][4]:.0f} µs above the floor ({got['floor'][4]:.0f})"
        for peer in ("portkey", "litellm"):
            if got.get(peer):
                line += f"; {name}/{peer} throughput {h[0]/got[peer][0]:.1f}×"
        print(line)
small = table("small chat, 32 conn", "small", errors=True)
ratios("small chat", small)
long = table("tracked long conversation (~440 KB body, 620 messages), 8 conn", "long")
ratios("long chat", long)
def streams(title, kind):
    print(f"\n| {title} | TTFB p50 ms | gap p50 ms | gap max ms |")
    print("| --- | ---: | ---: | ---: |")
    got = {}
    for t in ["direct", "handoff", "nginx"]:
        runs = [json.loads(r) for r in rows.get((kind, t), [])]
        if runs:
            got[t] = [med([g[k] for g in runs]) for k in ("ttfb_p50_ms", "gap_p50_ms", "gap_max_ms")]
            print(f"| {t} | {got[t][0]:.2f} | {got[t][1]:.2f} | {got[t][2]:.2f} |")
    if "handoff" in got and "direct" in got:
        print(f"\nTTFB added by handoff over direct: {got['handoff'][0] - got['direct'][0]:.2f} ms")
streams("chat streaming (64 deltas, 20 ms apart)", "stream")
c1 = table("small chat, 1 connection", "c1")
c1long = table("long conversation, 1 connection", "c1long")
for name, got in (("small", c1), ("long", c1long)):
    for proxy in ("handoff", "handoff-w1", "handoff-ws", "handoff-plain", "floor"):
        if got.get(proxy) and got.get("direct"):
            h, d, n = got[proxy], got["direct"], got.get("nginx")
            print(f"\nc=1 {name}: latency added by {proxy} over direct p50 {h[1] - d[1]:.3f} ms, p99 {h[2] - d[2]:.3f} ms"
                  + (f" (nginx: p50 {n[1] - d[1]:.3f} ms, p99 {n[2] - d[2]:.3f} ms)" if n else ""))
for api, prefix in (("Anthropic Messages", "a"), ("Responses", "r")):
    s_ = table(f"{api}, small, 32 conn", prefix + "small", errors=True)
    ratios(f"{api} small", s_)
    l_ = table(f"{api}, long, 8 conn", prefix + "long", errors=True)
    ratios(f"{api} long", l_)
    streams(f"{api} streaming", prefix + "stream")
if rows.get(("agent", "handoff")):
    agent = table("Claude Code's first request (87 KB: 48 KB tools, 29 KB system), 8 conn", "agent", errors=True)
    ratios("Claude Code's request", agent)
print(f"\nhandoff RSS: idle {int(idle)/1024:.1f} MB; after the load runs {int(loaded)/1024:.1f} MB; with {tracked.strip()} tracked conversations {int(full)/1024:.1f} MB")
if pg_tx:
    print(f"\npostgres store: {pg_tx}")
    appends = {t: med([float(r) for r in rows.get(("appends", t), [])]) for t in ["handoff", "handoff-pg"]}
    print(f"\nnew conversation per request (every request appends), 32 conn: disk {appends['handoff']:.0f} req/s, postgres {appends['handoff-pg']:.0f} req/s")
print(f"\noverhead metric: {overhead}")
PY
