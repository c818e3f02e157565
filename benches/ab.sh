#!/usr/bin/env bash
# A/B of handoff binaries (or settings) on CPU per request: each variant in front of
# bench-upstream, small chat with 32 connections and the ~440 KB conversation with 8,
# at the default log level (info: one access line per request, to a file outside the
# config's folder), interleaved over ROUNDS rounds.
#
#   benches/ab.sh [--duration S] [--rounds N] [--conversations N] NAME=BINARY[@WORKERS][%TOML] ...
#   e.g. benches/ab.sh before=/tmp/old/handoff after=target/release/handoff after-w1=target/release/handoff@1
#   %TOML appends that file to the variant's config, e.g.
#   redact=target/release/handoff%benches/e2e/redact10.toml (a redact hook, 10 patterns).
#   floor=target/release/bench-floor@2 runs the floor proxy (handoff's shape on hyper
#   and tokio, doing nothing else; two workers unless @WORKERS) as one more variant.
#
# Prints one line per run: variant, body, req/s, p50, CPU µs per request, context
# switches per request (all the process's threads), RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=4 ROUNDS=2 CONVERSATIONS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --conversations) CONVERSATIONS=$2; shift ;;
    *=*) break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ $# -gt 0 ] || { echo "usage: benches/ab.sh NAME=BINARY[@WORKERS] ..." >&2; exit 2; }
cargo build --release --quiet --bin bench-upstream --bin bench-floor -p mock-upstream
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
python3 benches/e2e/bodies.py "$WORK"
UP=18200 HO=18201
target/release/bench-upstream "127.0.0.1:$UP" 2>/dev/null &
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Context switches of every thread of the process, voluntary or not: each is a park and a
# wake-up, the cost that CPU time alone does not explain.
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {n += $2} END {print n}'; }
for round in $(seq 1 "$ROUNDS"); do
  for variant in "$@"; do
    name=${variant%%=*} spec=${variant#*=} extra=""
    if [[ "$spec" == *%* ]]; then extra=$(cat "${spec#*%}"); spec=${spec%%\%*}; fi
    binary=${spec%@*} workers=""
    # Only when asked: a binary older than the `workers` key refuses it.
    [[ "$spec" == *@* ]] && workers="workers = ${spec##*@}"
    for body in small long; do
      rm -rf "$WORK/data"
      printf 'listen = "127.0.0.1:%s"\ndata_dir = "%s/data"\n%s\n[upstream]\nbase_url = "http://127.0.0.1:%s"\n[models."bench-model"]\ncontext_window = 1000000\n%s\n' \
        "$HO" "$WORK" "$workers" "$UP" "$extra" > "$WORK/handoff.toml"
      if [ "$(basename "$binary")" = bench-floor ]; then
        # The floor: handoff's threading shape on hyper and tokio, doing nothing else.
        "$binary" "127.0.0.1:$HO" "http://127.0.0.1:$UP" ${workers#workers = } 2>"$WORK/../handoff-ab.log" & pid=$!
      else
        "$binary" serve --config "$WORK/handoff.toml" 2>"$WORK/../handoff-ab.log" & pid=$!
      fi
      for _ in $(seq 1 100); do (echo > "/dev/tcp/127.0.0.1/$HO") 2>/dev/null && break; sleep 0.1; done
      conns=32 conversation="" script=benches/e2e/post.lua
      [ "$body" = long ] && conns=8 conversation=bench-long
      # --conversations N: the small body as N conversations in turn, not one shared by
      # every connection (which makes the workers wait for each other on its lock).
      [ "$body" = small ] && [ "$CONVERSATIONS" -gt 0 ] && script=benches/e2e/many.lua
      BODY="$WORK/$body.json" CONVERSATION=$conversation wrk -t1 -c1 -d1s -s benches/e2e/post.lua "http://127.0.0.1:$HO/v1/chat/completions" >/dev/null
      before=$(ticks "$pid") switched=$(switches "$pid")
      out=$(BODY="$WORK/$body.json" CONVERSATION=$conversation CONVERSATIONS=$CONVERSATIONS wrk -t2 -c"$conns" -d"${DURATION}s" --latency -s "$script" "http://127.0.0.1:$HO/v1/chat/completions")
      after=$(ticks "$pid") switched=$(( $(switches "$pid") - switched ))
      rss=$(ps -o rss= -p "$pid")
      kill "$pid"; wait "$pid" 2>/dev/null || true
      requests=$(echo "$out" | grep -oP '\d+(?= requests in)')
      rps=$(echo "$out" | grep -oP 'Requests/sec:\s+\K[\d.]+')
      p50=$(echo "$out" | grep -P '^\s+50%' | awk '{print $2}')
      cpu=$(python3 -c "print(round(($after - $before) / $(getconf CLK_TCK) * 1e6 / $requests, 1))")
      cs=$(python3 -c "print(round($switched / $requests, 3))")
      echo "$name $body req/s=$rps p50=$p50 cpu_us=$cpu cs_per_req=$cs rss_mb=$((rss / 1024))"
    done
  done
done
