"""An exec plugin that misbehaves on purpose: hang, crash, garbage, huge, error,
chatty (writes without end), fork PIDFILE (leaves a child behind, then answers),
hang-fork PIDFILE (leaves a child behind, writes both pids, then hangs)."""
import json
import os
import subprocess
import sys
import time

mode = sys.argv[1]
sys.stdin.read()
if mode == "hang":
    time.sleep(3600)
elif mode == "crash":
    sys.stderr.write("Traceback: plugin exploded\n")
    sys.exit(3)
elif mode == "garbage":
    sys.stdout.write("this is not json {")
elif mode == "huge":
    sys.stdout.write('{"summary": "' + "x" * (10 * 1024 * 1024) + '"}')
elif mode == "error":
    json.dump({"error": "the plugin declined", "usage": {"prompt_tokens": 7}}, sys.stdout)
elif mode == "chatty":
    while True:
        sys.stdout.write("chatter " * 1024)
elif mode == "fork":
    child = subprocess.Popen(["sleep", "300"], start_new_session=False)
    with open(sys.argv[2], "w") as f:
        f.write(str(child.pid))
    json.dump({"summary": "a summary from a plugin that forked"}, sys.stdout)
elif mode == "hang-fork":
    child = subprocess.Popen(["sleep", "300"], start_new_session=False)
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    time.sleep(3600)
