#!/usr/bin/env bash
# What a session costs: a 40-turn tool-using agent (8 tools, 2k-token tool results, a
# 32k window) against a provider that caches and bills as the providers document
# (tests/mock-upstream/src/cache.rs: Anthropic's breakpoints, lookback and minimum,
# OpenAI's automatic prefix caching; Claude Sonnet 4.5 and GPT-4o list prices). Runs:
# no compaction on a 200k window, the client compacting itself, and through handoff
# (inline, the default config, extract only). Prints one Markdown table per caching
# style. The sessions run on the real clock; a preparation's timing varies a little.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -q -p handoff --lib testing::cost::table -- --ignored --nocapture 2>/dev/null \
  | grep -E '^(\||Breakpoints|Automatic)'
