#!/usr/bin/env bash
# Zero-wait compaction measured on the release binary against the in-repo mock
# summariser (tests/mock-upstream bin mock-summarizer): summariser latency × how fast
# the conversation grows, with preparation (prepare_at = "auto", the default) and
# without (0), each with max_wait = 2s (the default) and, as the baseline, with a
# max_wait so long that every compacting request waits for its summary; and, for the
# facts a stand-in must not lose, the same conversation with its summariser down (every
# summary call fails: the chain's deterministic fallback commits).
#
# Growth:
#   chat  - 20 user turns of about 450 tokens on an 8k model that takes 1 s a request;
#           summaries on a 16k model (one call each).
#   agent - 30 turns of an agent on a 16k model that answers at once: a short question,
#           a tool call, about 1,300 tokens of tool output, an answer, 0.3 s between
#           turns; summaries on a 4k model, so each span is folded into parts.
#
# Prints a Markdown table: the client's slowest request, requests over 2.5 s, the
# stand-ins sent, the committed compactions (summarised / extract), the summary calls
# the provider saw and their input tokens per committed compaction (what the
# summaries cost, wasted ones included), and the facts of every turn in the final
# request the provider saw.
#
#   benches/zero_wait.sh                # every scenario
#   DELAYS="4" GROWTHS="agent" benches/zero_wait.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MOCK_PORT=${MOCK_PORT:-18120}
PROXY_PORT=${PROXY_PORT:-18121}
DELAYS=${DELAYS:-"down 4 30"}
GROWTHS=${GROWTHS:-"chat agent"}

cargo build --release --quiet --bin handoff -p handoff
cargo build --release --quiet --bin mock-summarizer -p mock-upstream
WORK=$(mktemp -d)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
# KEEP=1 keeps the data dirs (their logs) and prints where.
if [ "${KEEP:-0}" = 1 ]; then trap 'cleanup; echo "kept $WORK" >&2' EXIT; else trap 'cleanup; rm -rf "$WORK"' EXIT; fi
wait_port() { for _ in $(seq 1 600); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "nothing on port $1" >&2; exit 1; }

echo "| growth | summariser | preparation | max_wait | slowest request ms | requests over 2.5 s | stand-ins | compactions (summary / extract) | summary calls per compaction | summary input tokens per compaction | facts in the last request |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for growth in $GROWTHS; do
  for delay in $DELAYS; do
    settings=("auto 2s" "0 2s" "0 600s")
    # Down, nothing is waited for: one row, with the defaults.
    if [ "$delay" = down ]; then settings=("auto 2s"); fi
    for setting in "${settings[@]}"; do
      read -r prepare max_wait <<< "$setting"
      seconds=$delay down=0
      if [ "$delay" = down ]; then seconds=0 down=1; fi
      if [ "$growth" = chat ]; then turn_secs=1; else turn_secs=0; fi
      CALLS="$WORK/calls-$growth-$delay-$prepare-$max_wait.jsonl"
      LAST="$WORK/last-$growth-$delay-$prepare-$max_wait.json"
      MOCK_SUMMARIZER_LOG="$CALLS" MOCK_SUMMARIZER_LAST="$LAST" MOCK_SUMMARIZER_DOWN="$down" \
        target/release/mock-summarizer "127.0.0.1:$MOCK_PORT" "$seconds" "$turn_secs" > /dev/null &
      PIDS=($!)
      wait_port "$MOCK_PORT"
      DATA="$WORK/data-$growth-$delay-$prepare-$max_wait"
      if [ "$growth" = chat ]; then summary_model=strict-16k; else summary_model=strict-4k; fi
      cat > "$WORK/handoff.toml" <<TOML
listen = "127.0.0.1:$PROXY_PORT"
data_dir = "$DATA"
[upstream]
base_url = "http://127.0.0.1:$MOCK_PORT"
[models."strict"]
context_window = 8192
[models."strict-16k"]
context_window = 16384
[models."strict-4k"]
context_window = 4096
[compaction]
strategy = "summarize"
summary_model = "$summary_model"
prepare_at = $( [ "$prepare" = auto ] && echo '"auto"' || echo "$prepare" )
max_wait = "$max_wait"
summary_timeout = "120s"
TOML
      target/release/handoff serve --config "$WORK/handoff.toml" 2> "$WORK/handoff.log" &
      PIDS+=($!)
      wait_port "$PROXY_PORT"
      python3 - "$PROXY_PORT" "$growth" "$delay" "$prepare" "$max_wait" "$DATA" "$CALLS" "$LAST" <<'PY'
import glob, json, re, sys, time, urllib.request
port, growth, delay, prepare, max_wait, data, calls_log, last_request = sys.argv[1:9]
latencies = []
def ask(model, messages, conversation):
    body = json.dumps({"model": model, "messages": messages}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
        {"content-type": "application/json", "authorization": "Bearer sk-bench", "x-handoff-conversation-id": conversation})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as answer:
        reply = json.load(answer)["choices"][0]["message"]
    return reply, (time.monotonic() - started) * 1000
model = "strict" if growth == "chat" else "strict-16k"
ask(model, [{"role": "user", "content": "hello"}], "warm-up")
messages = [{"role": "system", "content": "be brief"}]
turns = 20 if growth == "chat" else 30
last = None
for n in range(turns):
    if growth == "chat":
        words = " ".join(f"w{i}" for i in range(225))
        messages.append({"role": "user", "content": f"FACT-{n:03} {words}"})
    else:
        messages.append({"role": "user", "content": f"FACT-{n:03}: look up record {n}"})
    while True:
        reply, took = ask(model, messages, "bench")
        latencies.append(took)
        messages.append(reply)
        if not reply.get("tool_calls"):
            break
        for call in reply["tool_calls"]:
            if growth == "chat":
                content = "ok"
            else:
                filler = " ".join(f"r{i}" for i in range(590))
                content = f"FACT-{n:03}-result found\n{filler}\nend of record {n}"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    if growth == "agent":
        time.sleep(0.3)
# Let a run still going end, so its summary calls are counted.
time.sleep((0 if delay == "down" else float(delay)) * 2 + 2)
conv = glob.glob(f"{data}/tenants/*/conversations/bench")[0]
records = [json.loads(line) for line in open(f"{conv}/compactions.jsonl")] if glob.glob(f"{conv}/compactions.jsonl") else []
lines = [json.loads(line) for line in open(f"{conv}/messages.jsonl")]
stand_ins = [l for l in lines if l.get("kind") == "stand_in"]
summarised = [r for r in records if r["strategy"] == "summarize"]
# What the provider saw: every summary call (wasted ones too), and the final request.
calls = [json.loads(line) for line in open(calls_log)]
summaries = [c for c in calls if c["summary"]]
view = open(last_request).read()
facts = [f"FACT-{n:03}" for n in range(turns)]
if growth == "agent":
    facts += [f"FACT-{n:03}-result" for n in range(turns)]
words = set(re.split(r'[\s":\\,.]+', view))
kept = sum(1 for f in facts if f in words)
per_call = f"{len(summaries) / len(records):.1f}" if records else "-"
per_tokens = f"{sum(c['prompt_tokens'] for c in summaries) / len(records):,.0f}" if records else "-"
print(f"| {growth} | {delay if delay == 'down' else delay + ' s'} | {'auto' if prepare == 'auto' else 'off'} | {max_wait} | {max(latencies):.0f} | "
      f"{sum(1 for l in latencies if l > 2500)} | {len(stand_ins)} | {len(summarised)} / {len(records) - len(summarised)} | "
      f"{per_call} | {per_tokens} | {kept}/{len(facts)} |")
PY
      cleanup
    done
  done
done
