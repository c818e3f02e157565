#!/usr/bin/env bash
# A profile-guided release build of handoff. An instrumented build serves the training
# load (scripts/pgo_train.py: every dialect's small and long bodies, a conversation
# compacted, streams, requests that end early) against bench-upstream; the release
# build is then optimised with the profile it wrote: hot paths laid out together,
# inlined and branched the way traffic goes. See BENCHMARKS.md ("ninth session") for
# what it saves.
#
#   scripts/pgo-build.sh [--bolt] [--out PATH]        default: target/pgo/handoff
#   scripts/pgo-build.sh --check     only the training load, on the debug build
#
# --check is what CI runs: a training load that no longer gets the answers it expects
# (an API changed) fails there, not in the next deployment's build.
#
# --bolt then lays the optimised binary out again with BOLT (llvm-bolt, Debian's
# bolt-N), from a profile of the same load taken by BOLT's instrumentation: the code
# each request runs packed into fewer pages, cold code split off.
#
# Needs python3 and an llvm-profdata of rustc's LLVM major version: $LLVM_PROFDATA,
# rustup's (rustup component add llvm-tools), llvm-profdata-N or /usr/lib/llvm-N
# (Debian: apt-get install llvm-N). The two builds use their own target directories
# (target/pgo-generate, target/pgo-use), so the ordinary build's cache is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/pgo/handoff BOLT=0 CHECK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift ;;
    --bolt) BOLT=1 ;;
    --check) CHECK=1 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
if [ "$CHECK" = 0 ]; then
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
  LLVM_BOLT=""
  if [ "$BOLT" = 1 ]; then
    for candidate in "${LLVM_BOLT_BIN:-}" "$(command -v llvm-bolt || true)" "$(command -v "llvm-bolt-$major" || true)" \
      "/usr/lib/llvm-$major/bin/llvm-bolt"; do
      if [ -n "$candidate" ] && [ -x "$candidate" ]; then LLVM_BOLT=$candidate; break; fi
    done
    [ -n "$LLVM_BOLT" ] || { echo "--bolt: no llvm-bolt (apt-get install bolt-$major)" >&2; exit 1; }
  fi
fi

WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
# --check judges answers, not speed: the debug build the tests made serves it.
BIN=target/release PROFILE=release
[ "$CHECK" = 1 ] && BIN=target/debug PROFILE=dev
cargo build --profile "$PROFILE" --quiet --bin bench-upstream -p mock-upstream
# The instrumented build writes its profiles to a fixed path, so it is rebuilt only when
# the sources change; the optimised one reads a new path each time, so it always is.
RAW=target/pgo-generate/profiles
if [ "$CHECK" = 1 ]; then
  cargo build --profile dev --quiet --bin handoff -p handoff
else
  rm -rf "$RAW"
  RUSTFLAGS="-Cprofile-generate=$PWD/$RAW" \
    cargo build --release --quiet --bin handoff -p handoff --target-dir target/pgo-generate
fi

python3 benches/e2e/bodies.py "$WORK"
UP=18250 HO=18251
"$BIN/bench-upstream" "127.0.0.1:$UP" 2>/dev/null &
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
# Serves the training load with BINARY, and exits it cleanly: the profiles are written
# at exit, and SIGTERM drains and exits.
train() {
  local pid
  rm -rf "$WORK/data"
  "$1" serve --config "$WORK/handoff.toml" 2>"$WORK/handoff.log" &
  pid=$!
  for _ in $(seq 1 300); do (echo > "/dev/tcp/127.0.0.1/$HO") 2>/dev/null && break; sleep 0.1; done
  python3 scripts/pgo_train.py "127.0.0.1:$HO" "$WORK" || { tail -20 "$WORK/handoff.log" >&2; exit 1; }
  kill -TERM "$pid"
  wait "$pid"
}
if [ "$CHECK" = 1 ]; then
  train target/debug/handoff
  echo "the training load got the answers it expects"
  exit 0
fi
train target/pgo-generate/release/handoff
"$PROFDATA" merge -o "$WORK/handoff.profdata" "$RAW"

USE_FLAGS="-Cprofile-use=$WORK/handoff.profdata -Cllvm-args=-pgo-warn-missing-function=false"
# BOLT moves functions only in a binary that kept its relocations.
if [ "$BOLT" = 1 ]; then USE_FLAGS="$USE_FLAGS -Clink-arg=-Wl,--emit-relocs"; fi
RUSTFLAGS="$USE_FLAGS" cargo build --release --quiet --bin handoff -p handoff --target-dir target/pgo-use
mkdir -p "$(dirname "$OUT")"
if [ "$BOLT" = 1 ]; then
  # BOLT's warnings (about ring's assembly, mimalloc's cold splits) are kept for a failure.
  "$LLVM_BOLT" target/pgo-use/release/handoff -instrument -o "$WORK/handoff.instrumented" \
    --instrumentation-file="$WORK/bolt.fdata" >"$WORK/bolt.log" 2>&1 || { tail -20 "$WORK/bolt.log" >&2; exit 1; }
  train "$WORK/handoff.instrumented"
  "$LLVM_BOLT" target/pgo-use/release/handoff -o "$OUT" -data="$WORK/bolt.fdata" \
    -reorder-blocks=ext-tsp -reorder-functions=cdsort -split-functions -split-all-cold \
    -split-eh -icf=1 -use-gnu-stack >"$WORK/bolt.log" 2>&1 || { tail -20 "$WORK/bolt.log" >&2; exit 1; }
else
  cp target/pgo-use/release/handoff "$OUT"
fi
echo "$OUT"
