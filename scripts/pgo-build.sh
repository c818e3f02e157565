#!/usr/bin/env bash
# A profile-guided release build of handoff. An instrumented build serves the training
# load (scripts/pgo_train.py: every dialect's small and long bodies, a conversation
# compacted, streams, requests that end early) against bench-upstream; the release
# build is then optimised with the profile it wrote: hot paths laid out together,
# inlined and branched the way traffic goes. See BENCHMARKS.md ("ninth session") for
# what it saves.
#
#   scripts/pgo-build.sh [--out PATH]        default: target/pgo/handoff
#
# Needs python3 and an llvm-profdata of rustc's LLVM major version: $LLVM_PROFDATA,
# rustup's (rustup component add llvm-tools), llvm-profdata-N or /usr/lib/llvm-N
# (Debian: apt-get install llvm-N). The two builds use their own target directories
# (target/pgo-generate, target/pgo-use), so the ordinary build's cache is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/pgo/handoff
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
host=$(rustc -vV | sed -n 's/^host: //p')
PROFDATA=""
for candidate in "${LLVM_PROFDATA:-}" "$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata" \
  "$(command -v "llvm-profdata-$major" || true)" "/usr/lib/llvm-$major/bin/llvm-profdata"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then PROFDATA=$candidate; break; fi
done
[ -n "$PROFDATA" ] || {
  echo "no llvm-profdata for LLVM $major: rustup component add llvm-tools, or apt-get install llvm-$major" >&2
  exit 1
}

WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
cargo build --release --quiet --bin bench-upstream -p mock-upstream
RUSTFLAGS="-Cprofile-generate=$WORK/raw" \
  cargo build --release --quiet --bin handoff -p handoff --target-dir target/pgo-generate

python3 benches/e2e/bodies.py "$WORK"
UP=18250 HO=18251
target/release/bench-upstream "127.0.0.1:$UP" 2>/dev/null &
cat > "$WORK/handoff.toml" <<TOML
listen = "127.0.0.1:$HO"
data_dir = "$WORK/data"
[upstream]
base_url = "http://127.0.0.1:$UP"
[log]
level = "warn"
[models."bench-model"]
context_window = 1000000
[models."train-compact"]
context_window = 60000
TOML
target/pgo-generate/release/handoff serve --config "$WORK/handoff.toml" 2>"$WORK/handoff.log" &
pid=$!
for _ in $(seq 1 300); do (echo > "/dev/tcp/127.0.0.1/$HO") 2>/dev/null && break; sleep 0.1; done
python3 scripts/pgo_train.py "127.0.0.1:$HO" "$WORK" || { tail -20 "$WORK/handoff.log" >&2; exit 1; }
# The profile is written at exit: SIGTERM drains and exits cleanly.
kill -TERM "$pid"
wait "$pid"
"$PROFDATA" merge -o "$WORK/handoff.profdata" "$WORK/raw"

RUSTFLAGS="-Cprofile-use=$WORK/handoff.profdata -Cllvm-args=-pgo-warn-missing-function=false" \
  cargo build --release --quiet --bin handoff -p handoff --target-dir target/pgo-use
mkdir -p "$(dirname "$OUT")"
cp target/pgo-use/release/handoff "$OUT"
echo "$OUT"
