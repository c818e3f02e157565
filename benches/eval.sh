#!/usr/bin/env bash
# Strategies compared on data: `handoff eval` over the shared real conversations,
# summarize vs extract vs summarize,extract at 8k, 16k and 32k windows. Summaries come
# from the in-repo mock summariser (tests/mock-upstream, bin mock-summarizer), which
# keeps every word with a digit it is shown: the table measures what reaches the
# summary and what it costs, not a model's writing. Prints a Markdown table.
#
#   benches/eval.sh [DATA_DIR]      (default ../shared/data/conversations)
#   PROBE='[0-9]{2,}' benches/eval.sh   # the facts recall looks for
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/conversations}
PROBE=${PROBE:-'[0-9]{2,}'}
PORT=18100

cargo build --release --quiet --bin handoff -p handoff
cargo build --release --quiet --bin mock-summarizer -p mock-upstream
WORK=$(mktemp -d)
target/release/mock-summarizer "127.0.0.1:$PORT" > "$WORK/summarizer.log" &
SUMMARIZER=$!
trap 'kill $SUMMARIZER 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 1 100); do (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done

FILES=()
for file in "$DATA"/*.json; do FILES+=(--file "$file"); done
echo "| window | chain | requests | compactions | tokens saved | summary calls | failed attempts | recall |"
echo "| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |"
for window in 8192 16384 32768; do
  for chain in summarize extract summarize,extract; do
    target/release/handoff eval "${FILES[@]}" --chain "$chain" --window "$window" \
      --upstream "http://127.0.0.1:$PORT" --probe "$PROBE" --json > "$WORK/report.json"
    python3 - "$window" "$chain" "$WORK/report.json" <<'PY'
import json, sys
window, chain, path = sys.argv[1], sys.argv[2], sys.argv[3]
total = json.load(open(path))["total"]
failed = ", ".join(f"{k} {v}" for k, v in total["failed"].items()) or "-"
recall = "-" if total["recall"] is None else f"{total['recall'] * 100:.0f}%"
saved = total["tokens_before"] - total["tokens_after"]
print(f"| {int(window) // 1024}k | {chain} | {total['requests']} | {total['compactions']} | {saved} | {total['summary_calls']} | {failed} | {recall} |")
PY
  done
done
