"""Captures the first request a real coding agent sends, for benches/instructions.sh:
Claude Code's (Anthropic Messages) as OUT/claude_agent_anthropic.json and Codex CLI's
(Responses) as OUT/codex_agent_responses.json, each with `stream` turned off so the
bench reads one JSON answer, and the model renamed to the bench's. The agents come from tests/agents (scripts/test.sh installs
them); their prompts and tool lists are theirs, so the captures stay out of the repo.

    python3 benches/e2e/capture_agent.py OUT
"""
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading

out = sys.argv[1]
bin_dir = os.path.join(os.path.dirname(__file__), "../../tests/agents/node_modules/.bin")
captured = {}


class Capture(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        captured.setdefault(self.path, body)
        # An error the agents give up on at once: one request is all the bench needs.
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"type":"error","error":{"type":"invalid_request_error","message":"captured"}}')

    def do_GET(self):
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Capture)
threading.Thread(target=server.serve_forever, daemon=True).start()
base = f"http://127.0.0.1:{server.server_port}"
home = tempfile.mkdtemp()
env = {"PATH": os.environ["PATH"], "HOME": home}
subprocess.run(
    [os.path.join(bin_dir, "claude"), "-p", "hello", "--model", "claude-sonnet-4-5", "--max-turns", "1"],
    env={**env, "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "sk-capture",
         "CLAUDE_CONFIG_DIR": os.path.join(home, ".claude"),
         "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"},
    cwd=home, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
codex_home = os.path.join(home, ".codex")
os.makedirs(codex_home)
with open(os.path.join(codex_home, "config.toml"), "w") as config:
    config.write(f'model = "gpt-5"\nmodel_provider = "capture"\ncheck_for_update_on_startup = false\n'
                 f'[model_providers.capture]\nname = "capture"\nbase_url = "{base}/v1"\nwire_api = "responses"\n'
                 f'env_key = "CAPTURE_KEY"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
                 f'[analytics]\nenabled = false\n[feedback]\nenabled = false\n')
subprocess.run(
    [os.path.join(bin_dir, "codex"), "exec", "--skip-git-repo-check", "--ephemeral", "hello"],
    env={**env, "CODEX_HOME": codex_home, "CAPTURE_KEY": "sk-capture"},
    cwd=home, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
server.shutdown()

for path, name in (("/v1/messages", "claude_agent_anthropic"), ("/v1/responses", "codex_agent_responses")):
    body = next((body for seen, body in captured.items() if seen.split("?")[0] == path), None)
    if body is None:
        sys.exit(f"no request reached {path}")
    request = json.loads(body)
    request["stream"] = False
    request["model"] = "bench-model"
    with open(os.path.join(out, f"{name}.json"), "w") as file:
        file.write(json.dumps(request, separators=(",", ":"), ensure_ascii=False))
    print(f"{name}.json: {len(body)} bytes, {len(json.dumps(request.get('tools', [])))} of them tools")
