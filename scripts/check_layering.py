#!/usr/bin/env python3
"""The layering check CI runs: reads the real `crate::` import graph of `src/` and the
layer table of docs/architecture.md, and fails, naming the files, on

- an import cycle between top-level modules;
- an import of a module in a higher layer than the importer's;
- a top-level module the table does not place, or a table entry with no module.

A module may import its own layer and the layers below. Edges are read from `use`
declarations and paths (`crate::a`, `crate::{a, b::c}`, a top-level file's
`super::a`); unit-test modules (`#[cfg(test)] mod tests` at a file's end, and the
files that hold them: `tests.rs`, `*_tests.rs`) are not read, since they are not
built into the binary. The in-process harness, `testing`, is read: it is the top
layer, and nothing but tests may import it.

usage: scripts/check_layering.py [REPO]   (prints the graph with --graph)
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else os.path.join(os.path.dirname(__file__), ".."))
SRC = os.path.join(ROOT, "src")
DOC = os.path.join(ROOT, "docs", "architecture.md")
CRATE_ROOTS = {"lib", "main"}


def module_of(path):
    """The file's module path under `src`, as a list: src/a/b.rs is ['a', 'b']."""
    parts = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return [] if parts in ([p] for p in CRATE_ROOTS) else parts


def items_of(group):
    """The top-level names of a `{a, b::c, d::{e, f}}` group."""
    depth, item, out = 0, "", []
    for ch in group[1:-1]:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            out.append(item)
            item = ""
        else:
            item += ch
    out.append(item)
    return [i.strip().split("::")[0].strip() for i in out if i.strip()]


def code_of(path):
    text = open(path, encoding="utf-8").read()
    tests = re.search(r"#\[cfg\(test\)\]\s*mod tests\b", text)
    if tests:
        text = text[: tests.start()]
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def graph():
    """{importer: {imported: set(files)}} over top-level modules."""
    edges = defaultdict(lambda: defaultdict(set))
    modules = set()
    for directory, _, files in os.walk(SRC):
        for name in files:
            if not name.endswith(".rs") or name == "tests.rs" or name.endswith("_tests.rs"):
                continue
            path = os.path.join(directory, name)
            module = module_of(path)
            top = module[0] if module else None
            if top:
                modules.add(top)
            text = code_of(path)
            targets = []
            for match in re.finditer(r"\bcrate::(\{[^;]*?\}|[a-z_][a-z0-9_]*)", text):
                found = match.group(1)
                targets += items_of(found) if found.startswith("{") else [found]
            # From a top-level file, `super::x` is the crate root's x.
            if len(module) == 1:
                for match in re.finditer(r"\bsuper::(\{[^;]*?\}|[a-z_][a-z0-9_]*)", text):
                    found = match.group(1)
                    targets += items_of(found) if found.startswith("{") else [found]
            rel = os.path.relpath(path, ROOT)
            for target in targets:
                if target not in ("self", "super") and target != top and top:
                    edges[top][target].add(rel)
    for importer in edges:
        for target in list(edges[importer]):
            if target not in modules:
                del edges[importer][target]
    return modules, edges


def layers():
    """[(layer name, [modules])] from the `## Layers` table, bottom first."""
    text = open(DOC, encoding="utf-8").read()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("layer", "") or set(cells[0]) <= {"-", " "}:
            continue
        rows.append((cells[0], re.findall(r"`([a-z_]+)`", cells[1])))
    return rows


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    modules, edges = graph()
    if "--graph" in sys.argv:
        for importer in sorted(edges):
            print(importer, "->", " ".join(sorted(edges[importer])))
    problems = []
    for component in cycles(edges):
        ties = [
            f"    {a} -> {b} ({', '.join(sorted(edges[a][b]))})"
            for a in component
            for b in component
            if b in edges.get(a, {})
        ]
        problems.append("import cycle between " + ", ".join(component) + ":\n" + "\n".join(ties))
    rows = layers()
    level = {}
    for number, (name, members) in enumerate(rows):
        for member in members:
            if member in level:
                problems.append(f"the layer table places `{member}` twice")
            level[member] = (number, name)
    for module in sorted(modules - set(level)):
        problems.append(f"`{module}` is in no layer of docs/architecture.md")
    for member in sorted(set(level) - modules):
        problems.append(f"the layer table names `{member}`, which is no module of src/")
    for importer in sorted(edges):
        for target, files in sorted(edges[importer].items()):
            if importer in level and target in level and level[target][0] > level[importer][0]:
                problems.append(
                    f"upward import: `{importer}` ({level[importer][1]}) imports `{target}` "
                    f"({level[target][1]}) in {', '.join(sorted(files))}"
                )
    if problems:
        print("layering: broken", file=sys.stderr)
        for problem in problems:
            print("  " + problem, file=sys.stderr)
        return 1
    count = sum(len(t) for t in edges.values())
    print(f"layering: ok ({len(modules)} modules, {count} imports, {len(rows)} layers, no cycles)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
