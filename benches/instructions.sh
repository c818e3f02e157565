#!/usr/bin/env bash
# Instructions per request, counted by callgrind: deterministic where CPU time on a
# shared machine is not, so a change of 1% shows. One worker, one connection, a small
# chat request (or the ~440 KB conversation) to bench-upstream, repeated. Each binary
# runs twice under callgrind, with WARMUP+FEW and WARMUP+MANY requests; the difference
# divided by MANY-FEW is the cost of one request, start-up and exit cancelled out. All
# threads are counted (the log writer's too); syscalls and waiting are not.
#
#   benches/instructions.sh [--body small|long|small_anthropic|long_responses|...|FILE.json] [--top N] NAME=BINARY ...
#   e.g. benches/instructions.sh before=/tmp/old/handoff after=target/release/handoff \
#        floor=target/release/bench-floor
#
# --body FILE.json sends that file instead (named *anthropic* or *responses* for those
# APIs, as repeat.py routes them; it must ask for no stream): e.g. a real agent's
# request, captured by benches/e2e/capture_agent.py.
# --top N also prints each binary's N costliest functions per request (exclusive).
# --distinct gives each request's body a leading field of its own, so no prefix memo is
# ever found: what building one costs when nothing repeats it.
# --team runs handoff as a shared gateway: the bench's key is a team's proxy key and the
# upstream key is handoff's own (`upstream.api_key_env`), so every request's body is
# checked for upstream objects it names.
# Needs valgrind (Debian: apt-get install valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
BODY=small TOP=0 TEAM="" WARMUP=200 FEW=500 MANY=2500
while [ $# -gt 0 ]; do
  case "$1" in
    --body) BODY=$2; shift ;;
    --top) TOP=$2; shift ;;
    --distinct) export DISTINCT=1 ;;
    --team) TEAM="api_key_env = \"BENCH_UPSTREAM_KEY\"
[[auth.keys]]
name = \"bench\"
sha256 = \"$(printf %s sk-bench | sha256sum | cut -d' ' -f1)\"" ;;
    *=*) break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ $# -gt 0 ] || { echo "usage: benches/instructions.sh NAME=BINARY ..." >&2; exit 2; }
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
# The upstream key a --team run's handoff sends (bench-upstream takes any).
export BENCH_UPSTREAM_KEY=sk-upstream-bench
FILE=""
if [ -f "$BODY" ]; then FILE=$(realpath "$BODY"); BODY=$(basename "$BODY" .json); fi
case "$BODY" in long*|*agent*) FEW=50 MANY=250 ;; esac
cargo build --release --quiet --bin bench-upstream -p mock-upstream
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
python3 benches/e2e/bodies.py "$WORK"
[ -z "$FILE" ] || cp "$FILE" "$WORK/$BODY.json"
UP=18220 HO=18221
target/release/bench-upstream "127.0.0.1:$UP" 2>/dev/null &

# Runs BINARY under callgrind for WARMUP+COUNT requests; prints the total instructions.
run() {
  local binary=$1 count=$2 out=$3 pid
  rm -rf "$WORK/data"
  printf 'listen = "127.0.0.1:%s"\ndata_dir = "%s/data"\nworkers = 1\n[models."bench-model"]\ncontext_window = 1000000\n[upstream]\nbase_url = "http://127.0.0.1:%s"\n%s\n' \
    "$HO" "$WORK" "$UP" "$TEAM" > "$WORK/handoff.toml"
  if [ "$(basename "$binary")" = bench-floor ]; then
    valgrind --tool=callgrind --callgrind-out-file="$out" "$binary" "127.0.0.1:$HO" "http://127.0.0.1:$UP" 1 2>/dev/null & pid=$!
  else
    valgrind --tool=callgrind --callgrind-out-file="$out" "$binary" serve --config "$WORK/handoff.toml" 2>/dev/null & pid=$!
  fi
  for _ in $(seq 1 600); do (echo > "/dev/tcp/127.0.0.1/$HO") 2>/dev/null && break; sleep 0.1; done
  local conversation=""
  case "$BODY" in long*|*agent*) conversation=bench-$BODY ;; esac
  python3 benches/e2e/repeat.py "127.0.0.1:$HO" "$WORK/$BODY.json" $((WARMUP + count)) $conversation
  # SIGTERM: handoff drains and exits; bench-floor dies of it, and valgrind still writes.
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  awk '/^totals:/ {print $2}' "$out"
}

for variant in "$@"; do
  name=${variant%%=*} binary=${variant#*=}
  few=$(run "$binary" "$FEW" "$WORK/$name.few")
  many=$(run "$binary" "$MANY" "$WORK/$name.many")
  echo "$name $BODY: $(( (many - few) / (MANY - FEW) )) instructions per request"
  if [ "$TOP" -gt 0 ]; then
    python3 benches/e2e/callgrind_diff.py "$WORK/$name.few" "$WORK/$name.many" $((MANY - FEW)) "$TOP"
  fi
done
