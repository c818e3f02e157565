#!/usr/bin/env python3
"""The layering check CI runs. Cargo already refuses an import of a crate a crate does
not depend on; this checks what Cargo cannot see, against the two tables of
docs/architecture.md's `## Layers` section, and fails, naming the files, on

- a crate whose `Cargo.toml` uses other handoff crates than the crate table says, or a
  workspace crate the table does not name (so the picture cannot drift from the code);
- a crate's top-level module the layer table does not place, or places in another
  crate, or a table entry with no module;
- an import cycle between a crate's top-level modules, or between any of its files (a
  name taken through a re-export counts as taken from the file that defines it; a
  module's own file naming its submodules is containment, not an import);
- an import of a module of a higher layer than the importer's, inside one crate;
- a request pipeline (the numbered phases of `## One request`, each marked tracked or
  not) that is not the one `src/pipeline/mod.rs` lists, or a phase with no function or
  module of that name in `src/pipeline/`, or an untracked phase that the pass-through
  route (`src/pipeline/passthrough.rs`) does not run.

Edges are read from `use` declarations and paths (`crate::a`, `crate::{a, b::c}`, a
top-level file's `super::a`); a name that is no module of the crate (a layer below,
named at the crate's root) is Cargo's business. Unit-test modules (`#[cfg(test)] mod
tests` at a file's end, and the files `tests.rs`, `*_tests.rs`) are not read, since
they are not built into the binary. The in-process harness, `testing`, is read: it is
the top layer, and nothing but tests may import it.

usage: scripts/check_layering.py [REPO]   (prints the graph with --graph)
"""

import os
import re
import sys
import tomllib
from collections import defaultdict

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else os.path.join(os.path.dirname(__file__), ".."))
DOC = os.path.join(ROOT, "docs", "architecture.md")
CRATE_ROOTS = {"lib", "main"}


def workspace():
    """{crate name: (folder relative to ROOT, {handoff crates it uses})} of every member."""
    manifest = tomllib.load(open(os.path.join(ROOT, "Cargo.toml"), "rb"))
    out = {}
    for member in manifest["workspace"]["members"]:
        data = tomllib.load(open(os.path.join(ROOT, member, "Cargo.toml"), "rb"))
        uses = {name for name in data.get("dependencies", {}) if name.startswith("handoff")}
        out[data["package"]["name"]] = (os.path.normpath(member), uses)
    return out


def sources(folder, nested):
    """The `.rs` files of the crate in `folder`, without the crates nested in it."""
    for directory, subdirs, files in os.walk(folder):
        subdirs[:] = [d for d in subdirs if os.path.join(directory, d) not in nested]
        for name in files:
            if name.endswith(".rs") and name != "tests.rs" and not name.endswith("_tests.rs"):
                yield os.path.join(directory, name)


def module_of(path, src):
    """The file's module path in its crate, as a list: src/a/b.rs is ['a', 'b']."""
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
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


def graph(src, nested):
    """(modules, {importer: {imported: set(files)}}) over one crate's top-level modules."""
    edges = defaultdict(lambda: defaultdict(set))
    modules = set()
    for path in sources(src, nested):
        module = module_of(path, src)
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


IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
DEFINES = r"\b(?:fn|struct|enum|trait|type|const|static|mod|union)\s+{}\b|macro_rules!\s*{}\b"


def use_paths(tree):
    """The paths of a use tree (`a::{b, c::d as e}`): [(segments, name bound)]."""
    tree = re.sub(r"\s+", " ", tree).strip()
    out = []

    def walk(prefix, text):
        depth, item, items = 0, "", []
        for ch in text:
            depth += ch == "{"
            depth -= ch == "}"
            if ch == "," and depth == 0:
                items.append(item)
                item = ""
            else:
                item += ch
        items.append(item)
        for item in (i.strip() for i in items):
            if not item:
                continue
            if "{" in item:
                head, group = item.split("{", 1)
                walk(prefix + [s for s in head.split("::") if s.strip()], group.rsplit("}", 1)[0])
                continue
            alias = None
            if " as " in item:
                item, alias = (s.strip() for s in item.split(" as ", 1))
            segments = prefix + [s.strip() for s in item.split("::") if s.strip()]
            if segments and segments[-1] == "self":
                segments = segments[:-1]
            if segments:
                out.append((segments, alias or segments[-1]))

    walk([], tree)
    return out


class Files:
    """One crate's files, with what each defines, imports and re-exports, so that a path
    resolves to the file that defines its name."""

    def __init__(self, src, nested):
        self.module = {}
        for path in sources(src, nested):
            self.module[tuple(module_of(path, src))] = path
        self.text = {m: code_of(f) for m, f in self.module.items()}
        self.uses = {}
        for m, text in self.text.items():
            found = []
            for match in re.finditer(r"(\bpub(?:\s*\([^)]*\))?\s+)?\buse\s+([^;]+);", text):
                for segments, name in use_paths(match.group(2)):
                    found.append((bool(match.group(1)), segments, name))
            self.uses[m] = found

    def absolute(self, here, segments):
        """`segments` as written in module `here`, from the crate root; None outside it."""
        head, rest = segments[0], segments[1:]
        if head == "crate":
            return list(rest)
        if head in ("self", "super"):
            base = list(here)
            while segments and segments[0] in ("self", "super"):
                if segments[0] == "super":
                    base = base[:-1]
                segments = segments[1:]
            return base + list(segments)
        if tuple(here) + (head,) in self.module:
            return list(here) + list(segments)
        return None

    def resolve(self, segments, seen=0):
        """The module whose file defines the item `segments` (from the root) names."""
        module = ()
        for i, segment in enumerate(segments):
            if module + (segment,) in self.module:
                module += (segment,)
                continue
            if seen > 8 or segment == "*":
                return module
            name = segment
            if re.search(DEFINES.format(re.escape(name), re.escape(name)), self.text[module]):
                return module
            for _, path, bound in self.uses.get(module, []):
                if bound == name:
                    target = self.absolute(module, path)
                    if target is not None:
                        return self.resolve(target + list(segments[i + 1 :]), seen + 1)
            return module
        return module

    def edges(self):
        """{file: {file: names}} of the uses and paths of each file (re-exports aside)."""
        edges = defaultdict(lambda: defaultdict(set))
        for here, text in self.text.items():
            found = [(p, n) for public, p, n in self.uses[here] if not public]
            body = re.sub(r"\buse\s+[^;]+;|\bpub\s*\(\s*in\s+[^)]*\)", "", text)
            children = {m[-1] for m in self.module if len(m) == len(here) + 1 and m[:-1] == here}
            starts = ["crate", "self", "super"] + sorted(children)
            pattern = r"(?<![\w:])((?:%s)(?:::%s)+)" % ("|".join(starts), IDENT)
            for match in re.finditer(pattern, body):
                segments = match.group(1).split("::")
                found.append((segments, segments[-1]))
            for segments, name in found:
                target = self.absolute(here, segments)
                if target is None:
                    continue
                module = self.resolve(target)
                # A module's file holds its submodules: naming them is containment, not
                # an import (what they take from it is their folder's front door).
                inside = module[: len(here)] == here
                if not inside and module in self.module:
                    edges[self.module[here]][self.module[module]].add(name)
        return edges


def tables():
    """The `## Layers` section's two tables: [(layer, crate, [modules])] bottom first,
    and {crate: (folder, {crates it uses})}."""
    text = open(DOC, encoding="utf-8").read()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers, crates, header = [], {}, None
    for line in section.splitlines():
        if not line.startswith("|"):
            header = None if not line.strip() else header
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("layer", "crate"):
            header = cells[0]
            continue
        if set(cells[0]) <= {"-", " "}:
            continue
        names = lambda cell: re.findall(r"`([a-z_-]+)`", cell)
        if header == "layer":
            layers.append((cells[0], names(cells[1])[0], names(cells[2])))
        elif header == "crate":
            crates[names(cells[0])[0]] = (cells[1].strip("`"), set(names(cells[2])))
    return layers, crates


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


def check_crates(members, crates):
    problems = []
    for name, (folder, uses) in sorted(members.items()):
        if name not in crates:
            if folder.startswith(("src", "crates", "plugins")):
                problems.append(f"the crate table does not name `{name}` ({folder})")
            continue
        want_folder, want_uses = crates[name]
        if os.path.normpath(want_folder) != folder:
            problems.append(f"the crate table puts `{name}` in {want_folder}; it is in {folder}")
        if uses != want_uses:
            extra, missing = sorted(uses - want_uses), sorted(want_uses - uses)
            problems.append(
                f"`{name}` uses other crates than the crate table says: "
                f"Cargo.toml adds {extra or 'nothing'}, lacks {missing or 'nothing'}"
            )
    for name in sorted(set(crates) - set(members)):
        problems.append(f"the crate table names `{name}`, which is no workspace crate")
    return problems


def check_layers(members, rows):
    problems, report, total = [], [], [0, 0, 0]
    level = {}
    for number, (name, crate, modules) in enumerate(rows):
        for module in modules:
            if (crate, module) in level:
                problems.append(f"the layer table places `{module}` of `{crate}` twice")
            level[(crate, module)] = (number, name)
    folders = {name: os.path.normpath(os.path.join(ROOT, folder)) for name, (folder, _) in members.items()}
    nested = set(folders.values())
    for crate in sorted({crate for _, crate, _ in rows}):
        if crate not in folders:
            problems.append(f"the layer table names the crate `{crate}`, which is no workspace crate")
            continue
        src = folders[crate]
        if os.path.isdir(os.path.join(src, "src")) and not os.path.exists(os.path.join(src, "lib.rs")):
            src = os.path.join(src, "src")
        modules, edges = graph(src, nested - {folders[crate]})
        placed = {module for (c, module) in level if c == crate}
        for module in sorted(modules - placed):
            problems.append(f"`{module}` of `{crate}` is in no layer of docs/architecture.md")
        for module in sorted(placed - modules):
            problems.append(f"the layer table names `{module}`, which is no module of `{crate}`")
        for component in cycles(edges):
            ties = [
                f"    {a} -> {b} ({', '.join(sorted(edges[a][b]))})"
                for a in component
                for b in component
                if b in edges.get(a, {})
            ]
            problems.append(f"import cycle in `{crate}` between " + ", ".join(component) + ":\n" + "\n".join(ties))
        files = Files(src, nested - {folders[crate]}).edges()
        for component in cycles(files):
            ties = [
                f"    {os.path.relpath(a, ROOT)} -> {os.path.relpath(b, ROOT)} ({', '.join(sorted(files[a][b]))})"
                for a in component
                for b in component
                if b in files.get(a, {})
            ]
            problems.append(f"import cycle in `{crate}` between files:\n" + "\n".join(ties))
        total[2] += sum(len(t) for t in files.values())
        for importer in sorted(edges):
            for target, files in sorted(edges[importer].items()):
                low, high = level.get((crate, importer)), level.get((crate, target))
                if low and high and high[0] > low[0]:
                    problems.append(
                        f"upward import: `{importer}` ({low[1]}) imports `{target}` "
                        f"({high[1]}) in {', '.join(sorted(files))}"
                    )
                if "--graph" in sys.argv:
                    report.append(f"{crate}: {importer} -> {target}")
        total[0] += len(modules)
        total[1] += sum(len(t) for t in edges.values())
    return problems, report, total


def phases(text, prefix):
    """The numbered phases of `text` (lines starting with `prefix`): name and whether
    it is marked *(tracked)*."""
    found = re.findall(rf"^{prefix}\d+\. \*\*([a-z_]+)\*\*( \*\(tracked\)\*)?", text, re.M)
    return [(name, bool(tracked)) for name, tracked in found]


def check_pipeline():
    """The request phases, as docs/architecture.md and src/pipeline/mod.rs number them."""
    doc = open(DOC, encoding="utf-8").read().split("## One request", 1)[1].split("\n## ", 1)[0]
    documented = phases(doc, "")
    pipeline = os.path.join(ROOT, "src", "pipeline")
    header = open(os.path.join(pipeline, "mod.rs"), encoding="utf-8").read()
    listed = phases(header, "//! ")
    problems = []
    if not documented or documented != listed:
        problems.append(
            f"the request pipeline drifted: docs/architecture.md has {documented}, "
            f"src/pipeline/mod.rs has {listed}"
        )
    code = ""
    for folder, _, files in os.walk(pipeline):
        for name in files:
            if name.endswith(".rs") and name != "tests.rs":
                code += open(os.path.join(folder, name), encoding="utf-8").read()
    passthrough = open(os.path.join(pipeline, "passthrough.rs"), encoding="utf-8").read()
    for phase, tracked in listed:
        if not re.search(rf"\bfn {phase}\b", code) and not os.path.exists(
            os.path.join(pipeline, f"{phase}.rs")
        ):
            problems.append(f"the phase `{phase}` is no function or module of src/pipeline")
        if not tracked and not re.search(rf"\b{phase}\b", passthrough):
            problems.append(
                f"the phase `{phase}` is not marked tracked, but src/pipeline/passthrough.rs "
                "does not run it"
            )
    return problems, len(listed)


def self_test():
    """The file check on a crate made to hold a cycle (a.rs and b.rs take from each
    other) and containment (lib.rs names both): it must find the one and not the other.
    Run first, so a check that went blind fails CI too."""
    import tempfile

    with tempfile.TemporaryDirectory() as src:
        files = {
            "lib.rs": "mod a;\nmod b;\npub use a::A;\npub(crate) fn root() {}\n",
            "a.rs": "use crate::b::B;\npub struct A(B);\n",
            "b.rs": "pub struct B;\npub fn f() -> crate::A { super::root(); todo!() }\n",
        }
        for name, text in files.items():
            open(os.path.join(src, name), "w").write(text)
        found = cycles(Files(src, set()).edges())
        names = [sorted(os.path.basename(f) for f in c) for c in found]
        if names != [["a.rs", "b.rs"]]:
            return [f"the file check is broken: on a.rs <-> b.rs it found {names}"]
    return []


def main():
    problems = self_test()
    if problems:
        print("layering: broken\n  " + problems[0], file=sys.stderr)
        return 1
    members = workspace()
    rows, crates = tables()
    problems = check_crates(members, crates)
    more, report, (modules, imports, file_imports) = check_layers(members, rows)
    problems += more
    more, stages = check_pipeline()
    problems += more
    if report:
        print("\n".join(report))
    if problems:
        print("layering: broken", file=sys.stderr)
        for problem in problems:
            print("  " + problem, file=sys.stderr)
        return 1
    print(
        f"layering: ok ({len(crates)} crates, {modules} modules, {imports} imports "
        f"within crates, {file_imports} between files, {len(rows)} layers, no cycles; "
        f"{stages} request phases as documented)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
