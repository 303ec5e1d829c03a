"""The house holds its shape: no import loop, every import pointing down the stages, small
modules, stage folders, a map that names them.

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
RECORDS = {"__init__", "__main__", "cli", "command", "errors", "matrix", "matrix_keys", "cells", "tomlloc", "results", "rundir",
           "known_issues", "signatures", "sources", "stack", "training_program", "program_forms",
           "op_case", "op_inventory", "op_shrink", "op_sources"}
STAGES = {"provision", "images", "harness", "run", "external", "judge", "audit", "bisect", "bench", "dashboard",
          "publish", "ci", "launch", "fuzz"}


def _modules(*roots: Path) -> dict[str, Path]:
    """Dotted module name -> file, for distci/ (default) or the given package roots."""
    mods = {}
    for path in (p for root in (roots or (PACKAGE,)) for p in root.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _absolute(mod: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a `from X import` names, relative ones (`from ..runner import y`) resolved."""
    if node.level == 0:
        return node.module or ""
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the distci (or suites) modules it imports (anywhere in its body)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or node.level):
                module = _absolute(mod, path, node)
                subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in mods]
                targets = subs + ([module] if len(subs) < len(node.names) else [])
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


# Modules over the ceiling when the suites came under it; being split by their owner. The
# set only shrinks: a module leaving it must leave this list too, and no other may join.
KNOWN_OVER_CEILING: set[str] = set()


def test_no_module_over_the_ceiling() -> None:
    big = {str(p.relative_to(REPO)): n for p in _modules(PACKAGE, REPO / "suites").values()
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(big) - KNOWN_OVER_CEILING == set(), f"modules over {MAX_LINES} lines (split along their jobs): {big}"
    assert KNOWN_OVER_CEILING - set(big) == set(), (
        f"now under the ceiling: remove from KNOWN_OVER_CEILING {sorted(KNOWN_OVER_CEILING - set(big))}")


DIRECTION_LINE = re.compile(r"^Direction: (.+)$", re.M)


def stage_order(doc: str) -> dict[str, int]:
    """Stage -> rank, from the map's one `Direction: a < b < c/d < ...` line (`c/d`: one rank)."""
    (line,) = DIRECTION_LINE.findall(doc)
    return {name.strip(): rank for rank, level in enumerate(line.rstrip(".").split("<"))
            for name in level.split("/")}


def stage_of(module: str) -> str:
    """The stage a module sits in: `hub` (the CLI, the top), `records` (the top of distci/),
    a stage folder, or `suites` (the cell side)."""
    parts = module.split(".")
    if parts[0] == "suites":
        return "suites"
    if module in ("distci.cli", "distci.__main__"):
        return "hub"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else "records"


SUITES_MAY_IMPORT = {"suites", "records", "harness"}

# Upward arrows that existed when direction became a test, each with who removes it. The
# set only shrinks: a new upward arrow fails, and so does an entry that no longer exists.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def upward_arrows(edges: dict[str, set[str]], order: dict[str, int]) -> set[tuple[str, str]]:
    found = set()
    for a, targets in edges.items():
        sa = stage_of(a)
        for b in targets:
            sb = stage_of(b)
            if sa == "suites":
                bad = sb not in SUITES_MAY_IMPORT
            elif sb == "suites":
                bad = True  # the package never imports the cell side: it is not in the wheel
            else:
                bad = order[sb] > order[sa]
            if bad:
                found.add((a, b))
    return found


def test_the_direction_finder_finds_a_planted_upward_arrow() -> None:
    order = stage_order("Direction: records < provision < judge < publish/ci < hub.")
    assert order["publish"] == order["ci"] > order["judge"]
    edges = {"distci.judge.store": {"distci.provision.index", "distci.ci.actions"},
             "distci.publish.export": {"distci.ci.actions"}, "suites.checks": {"distci.judge.store", "distci.rundir"},
             "distci.run.fuzz": {"suites.space"}}
    assert upward_arrows(edges, {**order, "run": order["judge"]}) == {
        ("distci.judge.store", "distci.ci.actions"), ("suites.checks", "distci.judge.store"),
        ("distci.run.fuzz", "suites.space")}


def test_every_import_points_down_the_stages() -> None:
    order = stage_order((REPO / "docs" / "architecture.md").read_text())
    mods = _modules(PACKAGE, REPO / "suites")
    stages = {stage_of(m) for m in mods} - {"suites"}
    assert stages <= set(order), f"stages missing from the map's Direction line: {sorted(stages - set(order))}"
    found = upward_arrows(import_graph(mods), order)
    assert found - KNOWN_UPWARD == set(), "imports pointing up the stages (move the shared part down, or invert): " + \
        "; ".join(f"{a} -> {b}" for a, b in sorted(found - KNOWN_UPWARD))
    assert KNOWN_UPWARD - found == set(), f"gone: remove from KNOWN_UPWARD {sorted(KNOWN_UPWARD - found)}"


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


def test_launch_imports_only_records_provision_and_harness() -> None:
    """launch/ sits between harness and external: it may use what is below it, nothing above."""
    below = {"launch", "harness", "provision"}
    bad = sorted(f"{mod} -> {target}" for mod, targets in import_graph(_modules()).items()
                 if mod.startswith("distci.launch") for target in targets
                 if target.split(".")[1] not in below and target.split(".")[1] not in RECORDS)
    assert not bad, f"launch/ imports a stage above it: {bad}"


SUITE_ROOMS = ("scenario", "runner", "judges", "probes", "generators")
"""suites/'s rooms, lowest first (docs/architecture.md): a room imports only the rooms before
it; the pytest files (test_*.py, conftest.py, fuzz_entry.py, regressions/) and titan/ import
any room, and no room imports them."""


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in SUITE_ROOMS + ("titan",) else None


def room_arrows(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Imports from a room to a later room, or to a pytest file."""
    rank = {room: i for i, room in enumerate(SUITE_ROOMS)}
    bad = set()
    for a, targets in edges.items():
        ra = room_of(a)
        if ra is None or ra == "titan":
            continue
        for b in targets:
            rb = room_of(b)
            if b.startswith("suites") and b != "suites" and (rb is None or (rb != "titan" and rank[rb] > rank[ra])):
                bad.add((a, b))
    return bad


def test_the_room_finder_finds_a_planted_upward_import() -> None:
    edges = {"suites.scenario.record": {"suites.runner.models", "suites.scenario.columns"},
             "suites.judges.checks": {"suites.runner.step", "suites.conftest"},
             "suites.test_x": {"suites.generators.space"}}
    assert room_arrows(edges) == {("suites.scenario.record", "suites.runner.models"),
                                  ("suites.judges.checks", "suites.conftest")}


def test_suites_rooms_import_only_the_rooms_before_them() -> None:
    mods = _modules(REPO / "suites")
    assert {m.split(".")[1] for m in mods if m.count(".") >= 2 and (REPO / "suites" / m.split(".")[1]).is_dir()} \
        <= set(SUITE_ROOMS) | {"titan", "regressions"}, "a new folder in suites/: add it to SUITE_ROOMS"
    found = room_arrows(import_graph(mods))
    assert not found, "suites/ rooms importing a later room or a pytest file (move the shared part down): " + \
        "; ".join(f"{a} -> {b}" for a, b in sorted(found))
    assert not cycles(import_graph(mods)), f"import loops in suites/: {cycles(import_graph(mods))}"
