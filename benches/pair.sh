#!/usr/bin/env bash
# Paired CPU per request of two handoff binaries: both run side by side in front of one
# bench-upstream, and each pair of runs loads A then B, or B then A, in turn, so a
# noisy host weighs on both alike. Prints each pair and the median of the differences
# (B minus A), which is what to read on a shared machine; the medians of A and B alone
# move by several µs from run to run.
#
#   benches/pair.sh [--body small|long|FILE.json] [--pairs N] [--duration S] [--workers W] A B
#   e.g. benches/pair.sh --body long /tmp/old/handoff target/release/handoff
#
# small: the small chat body, 32 connections (the harness's small-chat row); long: the
# ~440 KB conversation, 8 connections; FILE.json: that body (e.g. a real agent's request
# from benches/e2e/capture_agent.py, sent to /v1/messages when its name says anthropic,
# /v1/responses when it says responses), 8 connections, as one conversation. CPU is
# read from /proc/<pid>/stat around each run.
set -euo pipefail
cd "$(dirname "$0")/.."
BODY=small PAIRS=8 DURATION=2 WORKERS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --body) BODY=$2; shift ;;
    --pairs) PAIRS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --workers) WORKERS=$2; shift ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -eq 2 ] || { echo "usage: benches/pair.sh [options] A B" >&2; exit 2; }
A=$1 B=$2
cargo build --release --quiet --bin bench-upstream -p mock-upstream
WORK=$(mktemp -d)
# The proxies are not this shell's jobs (started in $(...)): killed by pid, and waited
# for, so the next run finds their ports free.
PIDA="" PIDB=""
trap 'kill $(jobs -p) $PIDA $PIDB 2>/dev/null || true; for pid in $PIDA $PIDB; do while kill -0 $pid 2>/dev/null; do sleep 0.1; done; done; rm -rf "$WORK"' EXIT
python3 benches/e2e/bodies.py "$WORK"
UP=18230 PA=18231 PB=18232
target/release/bench-upstream "127.0.0.1:$UP" 2>/dev/null &

# Starts BINARY on PORT with its own data dir; prints its pid.
start() {
  local binary=$1 port=$2
  mkdir -p "$WORK/$port"
  printf 'listen = "127.0.0.1:%s"\ndata_dir = "%s/%s/data"\nworkers = %s\n[upstream]\nbase_url = "http://127.0.0.1:%s"\n[models."bench-model"]\ncontext_window = 1000000\n' \
    "$port" "$WORK" "$port" "$WORKERS" "$UP" > "$WORK/$port/handoff.toml"
  "$binary" serve --config "$WORK/$port/handoff.toml" >/dev/null 2>"$WORK/$port/log" &
  echo $!
}
PIDA=$(start "$A" $PA)
PIDB=$(start "$B" $PB)

ROUTE=/v1/chat/completions
if [ "$BODY" = long ]; then
  export BODY="$WORK/long.json" CONVERSATION=bench-long; CONNS=8
elif [ -f "$BODY" ]; then
  case "$(basename "$BODY")" in *anthropic*) ROUTE=/v1/messages ;; *responses*) ROUTE=/v1/responses ;; esac
  export BODY CONVERSATION=bench-file; CONNS=8
else
  export BODY="$WORK/small.json"; CONNS=32
fi
load() { wrk -t2 -c"$CONNS" -d"$1" -s benches/e2e/post.lua "http://127.0.0.1:$2$ROUTE"; }
for port in $PA $PB; do
  for _ in $(seq 1 100); do (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  load 1s "$port" >/dev/null
done
for pid in $PIDA $PIDB; do
  kill -0 "$pid" 2>/dev/null || { echo "a proxy did not start (is its port taken?)" >&2; exit 1; }
done

# CPU µs per request of one run against PID on PORT.
one() {
  local pid=$1 port=$2 before after requests
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  requests=$(load "${DURATION}s" "$port" | grep -oP '\d+(?= requests in)')
  after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  python3 -c "print(round(($after - $before) / $(getconf CLK_TCK) * 1e6 / $requests, 1))"
}
for pair in $(seq 1 "$PAIRS"); do
  if [ $((pair % 2)) = 1 ]; then a=$(one "$PIDA" $PA); b=$(one "$PIDB" $PB)
  else b=$(one "$PIDB" $PB); a=$(one "$PIDA" $PA); fi
  echo "$a $b"
done | python3 -c '
import statistics, sys
rows = [tuple(map(float, line.split())) for line in sys.stdin]
for a, b in rows:
    print(f"A {a:8.1f}  B {b:8.1f}  B-A {b - a:+8.1f}")
diffs = [b - a for a, b in rows]
lower = sum(d < 0 for d in diffs)
print(f"CPU µs/request: A median {statistics.median(a for a, _ in rows):.1f}, "
      f"B median {statistics.median(b for _, b in rows):.1f}, "
      f"paired median B-A {statistics.median(diffs):+.1f} ({lower} of {len(diffs)} pairs lower)")
'
