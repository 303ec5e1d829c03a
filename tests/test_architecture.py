"""The house holds its shape: no import loop, small modules, stage folders, a map that names them.

Read from the code's own imports (ast), so a loop through a function-level import counts too:
an import inside a function still ties the two modules together.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "distci"
MAX_LINES = 500
RECORDS = {"__init__", "__main__", "cli", "command", "errors", "matrix", "cells", "tomlloc", "results", "rundir",
           "stack"}
STAGES = {"provision", "images", "harness", "run", "fuzz", "external", "judge", "audit", "bisect", "bench", "dashboard",
          "ci"}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the distci modules it imports (anywhere in its body)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                targets = subs + ([node.module] if len(subs) < len(node.names) else [])
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges[mod].update(t for t in targets if t in mods and t != mod)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_planted_loop() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_loop_in_distci() -> None:
    loops = cycles(import_graph(_modules()))
    assert not loops, "import loops (break them by moving the shared part to the lower module): " + "; ".join(
        " <-> ".join(c) for c in loops)


def test_no_module_over_the_ceiling() -> None:
    big = {str(p.relative_to(REPO)): n for p in _modules().values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split along their jobs): {big}"


def test_the_top_of_distci_holds_only_records_and_stage_folders() -> None:
    top = {p.stem for p in PACKAGE.glob("*.py")}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert top - RECORDS == set(), f"modules at the top that belong in a stage folder: {sorted(top - RECORDS)}"
    assert folders - STAGES == set(), f"folders that are not stages of docs/architecture.md: {sorted(folders - STAGES)}"


def _named(doc: str, relative: Path) -> bool:
    if str(relative) in doc:
        return True
    # a folder's row may name its modules by file name: "| `images/` | plan + tag (`plan.py`), ..."
    folder = relative.parts[0]
    rows = [line for line in doc.splitlines() if f"`{folder}/" in line]
    return any(re.search(rf"`{re.escape(relative.name)}`", row) for row in rows)


@pytest.mark.parametrize("doc", ["docs/architecture.md"])
def test_the_map_names_every_module(doc: str) -> None:
    text = (REPO / doc).read_text()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.name in ("__init__.py", "__main__.py") or "templates" in relative.parts:
            continue
        if not _named(text, relative):
            missing.append(str(relative))
    assert not missing, f"{doc} does not name these modules (add each with its one job): {missing}"
