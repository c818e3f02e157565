#!/usr/bin/env bash
# Runs the property-based fuzz targets (tests/fuzz.rs) for as many cases as you like:
#   scripts/fuzz.sh [CASES]        default 20000 per target; CI runs 64
# Parsers of the three dialects, the SSE assemblers, the JSONL reader with torn lines,
# and the unit splitter; seeded from tests/fixtures/conversations. A failure prints the
# minimal input proptest found and saves its seed under tests/fuzz.proptest-regressions.
set -euo pipefail
cd "$(dirname "$0")/.."
PROPTEST_CASES=${1:-20000} cargo test --release --test fuzz -- --nocapture
