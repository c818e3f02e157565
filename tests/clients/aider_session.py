"""Drives aider, unmodified, through its documented scripting API for one session.

usage: aider_session.py MODE TURNS CHANGE_AT HISTORY
  MODE       aider's edit format: "ask", "diff" or "whole"
  TURNS      how many turns the user asks
  CHANGE_AT  before this turn the user edits facts.md by hand (0: never)
  HISTORY    "on": aider's own history summarisation at its default; "off": disabled

Run in a directory holding facts.md and counter.py, with OPENAI_API_BASE pointing at
handoff and OPENAI_API_KEY set. Prints one JSON line per turn: {"turn", "reply"}.
"""

import json
import sys

from aider.coders import Coder
from aider.io import InputOutput
from aider.models import Model

mode, turns, change_at, history = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

io = InputOutput(yes=True, pretty=False, fancy_input=False)
model = Model("openai/text-coder")
if history == "off":
    # What --max-chat-history-tokens sets: the size at which aider summarises its history.
    model.max_chat_history_tokens = 10**9
coder = Coder.create(
    main_model=model,
    edit_format=mode,
    io=io,
    fnames=["facts.md", "counter.py"],
    stream=True,
    auto_commits=False,
    use_git=False,
    map_tokens=0,
    suggest_shell_commands=False,
)

for n in range(1, turns + 1):
    if n == change_at:
        with open("facts.md", "w") as f:
            f.write("# Facts\n\nFACT_A = cobalt-42\nFACT_B = birch-88\n")
    # Each turn carries a log excerpt, so the session outgrows the window.
    log = "\n".join(f"log {n}.{i}: worker {n * 31 + i} finished step {i * 7} of job {n}" for i in range(40))
    reply = coder.run(f"Turn {n}. What do the files in the chat say now? Here is the log:\n{log}")
    print(json.dumps({"turn": n, "reply": reply}), flush=True)
