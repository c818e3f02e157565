#!/usr/bin/env python3
"""Per crate of `src/` (handoff) and `crates/` (its layers): its lines of Rust, and its items by visibility
(`pub` items, that is the crate's API, and `pub(crate)`/`pub(super)` ones), counting
`fn`, `struct`, `enum`, `trait`, `type`, `const`, `static`, `mod` and `use`
declarations outside unit-test modules: how much of each crate is its API.

usage: scripts/crate_stats.py [REPO]   (default: this checkout)
"""

import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
ITEM = r"(?:async\s+)?(?:unsafe\s+)?(?:fn|struct|enum|trait|type|const|static|mod|use)\b"
PUB = re.compile(r"^\s*pub\s+" + ITEM, re.M)
NARROW = re.compile(r"^\s*pub\((?:crate|super|in [^)]*)\)\s+" + ITEM, re.M)


def crate_of(path):
    """`crates/<name>` for a layer crate's file, or '' for handoff itself."""
    rel = os.path.relpath(path, ROOT).split(os.sep)
    return os.path.join(*rel[:2]) if rel[0] == "crates" else ""


def main():
    stats = {}
    walked = [w for top in ("src", "crates") for w in os.walk(os.path.join(ROOT, top))]
    for directory, _, files in walked:
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(directory, name)
            text = open(path, encoding="utf-8").read()
            lines = text.count("\n")
            if name == "tests.rs" or name.endswith("_tests.rs") or "testing" in path.split(os.sep):
                code = ""
            else:
                tests = re.search(r"#\[cfg\(test\)\]\s*mod tests\b", text)
                code = text[: tests.start()] if tests else text
            s = stats.setdefault(crate_of(path), [0, 0, 0])
            s[0] += lines
            s[1] += len(PUB.findall(code))
            s[2] += len(NARROW.findall(code))
    print(f"{'crate':<16} {'lines':>7} {'pub':>6} {'pub(crate)':>11}")
    for crate in sorted(stats, key=lambda c: (c == "", c)):
        lines, pub, narrow = stats[crate]
        print(f"{crate or 'src (handoff)':<16} {lines:>7} {pub:>6} {narrow:>11}")
    total = [sum(s[i] for s in stats.values()) for i in range(3)]
    print(f"{'total':<16} {total[0]:>7} {total[1]:>6} {total[2]:>11}")


if __name__ == "__main__":
    main()
