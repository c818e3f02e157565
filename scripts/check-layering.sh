#!/usr/bin/env bash
# The layering rules, checked in CI: the store imports no compaction or conversation
# code, and the base vocabulary (ids, digests, log lines, records, calibration)
# imports nothing of handoff's but itself. Exits non-zero, naming the lines, if broken.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
if grep -rnE 'crate::(compaction|conversation)\b' src/store; then
  echo "layering: src/store must not import from src/compaction or src/conversation" >&2
  status=1
fi
if grep -rn 'crate::' src/base | grep -v 'crate::base::'; then
  echo "layering: src/base must import nothing of handoff's but itself" >&2
  status=1
fi
[ "$status" = 0 ] && echo "layering: ok"
exit "$status"
