#!/usr/bin/env bash
# Zero-wait compaction measured on the release binary against the in-repo mock
# summariser (tests/mock-upstream bin mock-summarizer): summariser latency × how fast
# the conversation grows, with preparation (prepare_at = "auto", the default) and
# without (0), each with max_wait = 2s (the default) and, as the baseline, with a
# max_wait so long that every compacting request waits for its summary.
#
# Growth:
#   chat  - 20 user turns of about 450 tokens on an 8k model that takes 1 s a request;
#           summaries on a 16k model (one call each).
#   agent - 30 turns of an agent on a 16k model that answers at once: a short question,
#           a tool call, about 1,300 tokens of tool output, an answer, 0.3 s between
#           turns; summaries on a 4k model, so each span is folded into parts.
#
# Prints a Markdown table: the client's slowest request, requests over 2.5 s, the
# stand-ins sent, the committed compactions (summarised / extract), summary calls per
# summarised compaction, and the facts of every turn that reach the final request.
#
#   benches/zero_wait.sh                # every scenario
#   DELAYS="4" GROWTHS="agent" benches/zero_wait.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MOCK_PORT=${MOCK_PORT:-18120}
PROXY_PORT=${PROXY_PORT:-18121}
DELAYS=${DELAYS:-"4 30"}
GROWTHS=${GROWTHS:-"chat agent"}

cargo build --release --quiet --bin handoff -p handoff
cargo build --release --quiet --bin mock-summarizer -p mock-upstream
WORK=$(mktemp -d)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
# KEEP=1 keeps the data dirs (their logs) and prints where.
if [ "${KEEP:-0}" = 1 ]; then trap 'cleanup; echo "kept $WORK" >&2' EXIT; else trap 'cleanup; rm -rf "$WORK"' EXIT; fi
wait_port() { for _ in $(seq 1 600); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "nothing on port $1" >&2; exit 1; }

echo "| growth | summariser | preparation | max_wait | slowest request ms | requests over 2.5 s | stand-ins | compactions (summary / extract) | summary calls per summary | facts in the last request |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for growth in $GROWTHS; do
  for delay in $DELAYS; do
    for setting in "auto 2s" "0 2s" "0 600s"; do
      read -r prepare max_wait <<< "$setting"
      if [ "$growth" = chat ]; then turn_secs=1; else turn_secs=0; fi
      target/release/mock-summarizer "127.0.0.1:$MOCK_PORT" "$delay" "$turn_secs" > /dev/null &
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
      python3 - "$PROXY_PORT" "$growth" "$delay" "$prepare" "$max_wait" "$DATA" <<'PY'
import glob, json, re, sys, time, urllib.request
port, growth, delay, prepare, max_wait, data = sys.argv[1:7]
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
# The last request, as the provider got it: its facts.
last = json.dumps(messages)
# Let a run still going end, so its summary calls are counted.
time.sleep(float(delay) * 2 + 2)
conv = glob.glob(f"{data}/tenants/*/conversations/bench")[0]
records = [json.loads(line) for line in open(f"{conv}/compactions.jsonl")] if glob.glob(f"{conv}/compactions.jsonl") else []
lines = [json.loads(line) for line in open(f"{conv}/messages.jsonl")]
stand_ins = [l for l in lines if l.get("kind") == "stand_in"]
decisions = [l for l in lines if l.get("kind") == "decision"]
summarised = [r for r in records if r["strategy"] == "summarize"]
calls = [sum(a.get("calls") or 1 for a in r["attempts"] if a["strategy"] == "summarize") for r in summarised]
# What the last request's view carried: its compaction's handoff (committed or stand-in) and
# the messages after its cut.
sent = decisions[-1]["compaction"] if decisions else None
handoffs = {r["id"]: r for r in records}
handoffs.update({s["record"]["id"]: s["record"] for s in stand_ins})
view = ""
if sent in handoffs:
    record = handoffs[sent]
    view = json.dumps(record["handoff"]) + json.dumps(messages[1 + record["source"]["end_exclusive"]:])
else:
    view = json.dumps(messages)
facts = [f"FACT-{n:03}" for n in range(turns)]
if growth == "agent":
    facts += [f"FACT-{n:03}-result" for n in range(turns)]
words = set(re.split(r'[\s":\\,.]+', view))
kept = sum(1 for f in facts if f in words)
per = f"{sum(calls) / len(calls):.1f}" if calls else "-"
print(f"| {growth} | {delay} s | {'auto' if prepare == 'auto' else 'off'} | {max_wait} | {max(latencies):.0f} | "
      f"{sum(1 for l in latencies if l > 2500)} | {len(stand_ins)} | {len(summarised)} / {len(records) - len(summarised)} | {per} | {kept}/{len(facts)} |")
PY
      cleanup
    done
  done
done
