"""An exec plugin that misbehaves on purpose: hang, crash, garbage, huge, error."""
import json
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
