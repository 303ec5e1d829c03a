"""Tonight's regressions and the bisects they ask for; `infra` runs for cells that sent nothing.

A regression's bisect plan is the first package axis whose version differs between the
good run it was compared with and tonight's bad run (rule 8: bisect searches one package
between two points; the other packages stay pinned to the bad run's stack).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from distci.ci.ids import key, now
from distci.results import Result, error_signature
from distci.rundir import RunDir, RunInfo
from distci.judge.store import Store
from distci.sources import nightly_date_of
from distci.judge.verdicts import ENV_KEYS
from distci.judge.rows import Regression, is_fuzz
from distci.sources import PACKAGE_AXES
from distci.stack import Stack

BISECT_AXES = PACKAGE_AXES


def expected_cells(matrix_json: Path) -> list[dict[str, Any]]:
    """The include entries of a `distci matrix --json` output file."""
    return expected_cells_of(json.loads(Path(matrix_json).read_text()))


def expected_cells_of(data: Any) -> list[dict[str, Any]]:
    """The include entries of a `distci matrix --json` output (`{"include": [...]}` or the
    list), one per cell: a sharded tier lists each cell once per shard."""
    entries = list(data.get("include", data) if isinstance(data, dict) else data)
    seen: dict[Any, dict[str, Any]] = {}
    for entry in entries:
        key = entry.get("cell") if isinstance(entry, dict) else id(entry)
        seen.setdefault(key, entry)
    return list(seen.values())


def missing_cell_runs(expected: Sequence[Mapping[str, Any]], present: set[str], out: Path, *,
                      tier: str, reason: str) -> list[Path]:
    """An `infra` run for each expected cell that uploaded no run (rule 4: infra, never a pass).

    In Actions its id is made of the workflow run's id, so re-running the aggregate
    job does not add a second one.
    """
    made = []
    origin = f"gh{os.environ['GITHUB_RUN_ID']}" if os.environ.get("GITHUB_RUN_ID") else \
        time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for entry in expected:
        cell = str(entry["cell"])
        if cell in present:
            continue
        run_id = f"missing-{origin}-{cell}"
        run_dir = out / run_id
        stack = Stack.from_dict({"partial": True, "declared": dict(entry), "runner": ",".join(entry.get("runner", []))})
        RunDir(run_dir).append(Result(
            run_id=run_id, cell_id=cell, test_id=f"<infra>::{cell}", outcome="error", failure_kind="infra",
            error_signature=error_signature("MissingRun", "no results were uploaded for this cell"),
            message=f"no results were uploaded for this cell: {reason}", stack=stack,
            repro=f"nox -s dist_tests -- --cell {cell} --backend docker", started_at=now(),
        ))
        RunDir(run_dir).write_info(RunInfo(run_id=run_id, cell_id=cell, started_at=now(), ended_at=now(), tier=tier,
                                           runner=stack.runner, backend="docker"))
        made.append(run_dir)
    return made



@dataclass(frozen=True)
class BisectPlan:
    """What bisect.yml is asked: the first bad point of one package between two stacks."""

    cell_id: str
    test_id: str
    axis: str
    good: str
    bad: str
    run_id: str = ""

    @property
    def key(self) -> str:
        """The question asked: the same range of one package in one cell (per issue, so per signature)."""
        return key(self.cell_id, self.axis, self.good, self.bad)

    def inputs(self, issue: int) -> dict[str, str]:
        return {"test_id": self.test_id, "good": self.good, "bad": self.bad, "axis": self.axis,
                "cell": self.cell_id, "run": self.run_id, "issue": str(issue) if issue > 0 else ""}


def bisect_point(version: str) -> str:
    """A stack version as bisect takes it: a nightly's date, else the public version."""
    return nightly_date_of(version) or version.split("+", 1)[0]


def stack_changes(good: Stack, bad: Stack) -> list[str]:
    """What differs between two stacks, as `key: old -> new` lines (environment keys only)."""
    lines = []
    for name in ENV_KEYS:
        if name == "packages":
            continue
        if good.get(name) != bad.get(name):
            lines.append(f"{name}: {good.get(name)} -> {bad.get(name)}")
    old, new = set(good.packages or []), set(bad.packages or [])
    if old != new:
        lines.append(f"packages: {len(new - old)} pins changed ({', '.join(sorted(new - old)[:5])})")
    return lines


def issue_key(found: Regression) -> str:
    """The issue a regression is filed under: one per error signature."""
    return key(found.signature)


def occurrence_key(found: Regression) -> str:
    """One occurrence of a signature: the run and the test."""
    return key(found.run_id, found.test_id)


def bisect_plan(found: Regression) -> BisectPlan | None:
    """The bisect a regression asks for: the first package axis whose bisect point differs
    between the green run's stack and the failing run's; None when none does."""
    for axis in BISECT_AXES:
        good, bad = found.good_stack.get(axis), found.bad_stack.get(axis)
        if good and bad and good != bad and bisect_point(str(good)) != bisect_point(str(bad)):
            return BisectPlan(found.cell_id, found.test_id, axis, bisect_point(str(good)), bisect_point(str(bad)),
                              found.run_id)
    return None


# The fuzzer's configurations (distci.judge.rows.FUZZ_TESTS) are each new, so they have no
# green history to regress from; a failing one (verdict `fail`) is filed like a regression,
# by its signature, so only a new signature opens an issue.


def regressions(store: Store, run_ids: Iterable[str], registry: Any = None) -> list[Regression]:
    """Tonight's regressions and fuzz finds, in cell then test order. A fuzz find whose
    signature a registered entry explains outside that entry's tests is the entry's near
    miss (`registry`, Registry.near_misses): not filed, so no duplicate issue opens."""
    found = []
    for run_id in sorted(set(run_ids)):
        run = store.run(run_id)
        if run is None:
            continue
        fuzzed = [r for r in store.results(run_id=run_id, verdicts=["fail"]) if is_fuzz(r.test_id)
                  and not (registry is not None and registry.near_misses(
                      r.test_id, r.error_signature or "", r.excerpt or "", run.stack))]
        for r in [*store.results(run_id=run_id, verdicts=["regression"]), *fuzzed]:
            found.append(Regression(r, run, store.run(r.compared_run) if r.compared_run else None))
    return sorted(found, key=lambda g: (g.cell_id, g.test_id, g.run_id))

