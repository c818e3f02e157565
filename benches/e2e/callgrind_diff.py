"""Each function's instructions per request: (its exclusive count in the run of MANY
requests minus the run of FEW) / (MANY - FEW), the costliest TOP first.

    python3 benches/e2e/callgrind_diff.py FEW.out MANY.out REQUESTS TOP
"""
import collections
import re
import subprocess
import sys

few, many, requests, top = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])


def load(path):
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100", path], capture_output=True, text=True, check=True
    ).stdout
    costs = collections.Counter()
    for line in out.splitlines():
        match = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(.*)", line)
        if match and "PROGRAM TOTALS" not in line:
            name = re.sub(r"^[^:]*:", "", match[2], count=1)
            costs[re.sub(r" \[.*\]$", "", name)] += int(match[1].replace(",", ""))
    return costs


before, after = load(few), load(many)
per_request = {name: (after[name] - before[name]) / requests for name in set(before) | set(after)}
for name, cost in sorted(per_request.items(), key=lambda item: -item[1])[:top]:
    print(f"{cost:9.0f}  {name[:140]}")
