"""A tool_use agent that lets the Messages API manage its context, with the anthropic SDK.

MODE `compact`, `compact_stream` or `compact_pause`: every request carries the
`compact-2026-01-12` beta and a `compact_20260112` edit triggered past THRESHOLD input
tokens, plain, streamed, or pausing after the compaction (the client sends again);
the client keeps its whole history, compaction blocks included, as the SDK returns
them. MODE `clear_thinking`: thinking on, and Claude Code's `clear_thinking_20251015`
edit (beta `context-management-2025-06-27`), requests alternating plain and streamed.
Any SDK error fails the run.

Usage: anthropic_native_compaction.py MODE TURNS THRESHOLD [REPEAT]   (HANDOFF_URL in the environment)
Prints {"requests", "compactions", "replay", "sent", "blocks"}: `replay` is the message
list of the last request, `sent` that of each, in order; `blocks` each compaction block
as the SDK assembled it.
"""
import json
import os
import sys

import anthropic

from sdk_json import plain

mode, turns, threshold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# How many times each tool result repeats the filler: past a 50,000-token trigger in few turns.
repeat = int(sys.argv[4]) if len(sys.argv) > 4 else 1
client = anthropic.Anthropic(base_url=os.environ["HANDOFF_URL"], api_key="sk-ant-native-test",
                             max_retries=0)
TOOLS = [{"name": "lookup", "description": "Looks a fact up.", "input_schema": {"type": "object"}}]
FILLER = " ".join(f"row{i} value={i * 7 % 13}" for i in range(150 * repeat))

messages = []
requests = 0
blocks = []
last_sent = []
sent = []


def ask():
    global requests, last_sent
    requests += 1
    last_sent = plain(messages)
    sent.append(last_sent)
    kwargs = dict(model="claude-mock", max_tokens=512, system="You are a meticulous agent.",
                  tools=TOOLS, messages=messages)
    if mode == "clear_thinking":
        kwargs.update(betas=["context-management-2025-06-27"],
                      thinking={"type": "enabled", "budget_tokens": 256},
                      context_management={"edits": [{"type": "clear_thinking_20251015",
                                                     "keep": {"type": "thinking_turns", "value": 1}}]})
    else:
        edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": threshold}}
        if mode == "compact_pause":
            edit["pause_after_compaction"] = True
        kwargs.update(betas=["compact-2026-01-12"], context_management={"edits": [edit]})
    streamed = mode == "compact_stream" or (mode == "clear_thinking" and requests % 2)
    if streamed:
        with client.beta.messages.stream(**kwargs) as stream:
            return stream.get_final_message()
    return client.beta.messages.create(**kwargs)


for turn in range(1, turns + 1):
    messages.append({"role": "user", "content": f"Step {turn}. Remember FACT-{turn:03d} exactly. Then look it up."})
    while True:
        reply = ask()
        blocks.extend(plain(b) for b in reply.content if b.type == "compaction")
        messages.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason == "compaction":
            # Paused after the compaction: sent again to go on.
            continue
        calls = [b for b in reply.content if b.type == "tool_use"]
        if not calls:
            break
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": c.id, "content": f"Result of step {turn}: {FILLER}"}
            for c in calls]})

json.dump({"requests": requests, "compactions": len(blocks), "replay": last_sent, "sent": sent,
           "blocks": blocks}, sys.stdout)
