#!/usr/bin/env bash
# The long crash loop (tests/e2e/crash_loop.rs): kill -9 at random points while manual
# compactions run with a slow summarize and extract, restart, and check the log each time.
#   scripts/crash-loop.sh [ROUNDS] [SEED]      default 1000 rounds
set -euo pipefail
cd "$(dirname "$0")/.."
binary=$(cargo test --release --test e2e --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and "/e2e-" in m["executable"]][-1])')
export CRASH_LOOP_ROUNDS=${1:-1000} CRASH_LOOP_SEED=${2:-$RANDOM}
# The test binary finds the handoff binary where cargo built it.
time "$binary" crash_loop:: --nocapture
