"""`nox -s bench -- pr`: where the pr tier's time goes, phase by phase, cold and warm.

The pr tier runs on every pull request, so its wall time is the project's tempo. This
runs it through the product path (`python -m distci run --tier pr`, the default cell), then
reads the run directory back and splits the wall time into phases a person can act on:

- provision: from the run's start to its first test (resolve, wheelhouse, env, pytest start);
- tests by kind: compiled rows (Dynamo + inductor on every rank), eager rows, the rest;
- between tests: the harness's own time (pool starts for a new world size, rebuilds, isolation);
- closing: from the last test to the run's end (external suites, JUnit, run.json).

`--runs 2` runs the tier twice: the first is as cold as this machine is, the second warm
(wheelhouse, env and inductor's code cache reused): the figure docs/benchmarks.md quotes is the warm one.
Timings are wall clock on a shared machine: quote them with the machine's load (printed).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from distci.harness.compile_cache import graph_entries
from distci.provision.envs import default_root
from distci.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
GOAL_WARM_S = 60.0  # issue 42: a warm pr tier on 2 idle cores, inductor caches kept per stack


@dataclass
class Phases:
    """One pr-tier run's wall time, split (seconds)."""

    run_dir: str
    wall_s: float
    provision_s: float
    compiled_s: float
    eager_s: float
    other_s: float
    between_s: float
    closing_s: float
    tests: int
    load_1m: float
    slowest: list[tuple[str, float]] = field(default_factory=list)
    new_graphs: dict[str, int] = field(default_factory=dict)
    """FX graph / AOTAutograd cache entries the run wrote (a warm run's goal: none)."""
    cpu_s: float = 0.0
    """CPU seconds of the run's whole process tree (user + system)."""


def _time(stamp: str) -> float:
    return _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _kind(test_id: str) -> str:
    name = test_id.rsplit("::", 1)[-1]
    if "compile" in name:
        return "compiled"
    if "eager" in name:
        return "eager"
    return "other"


def phases_of(run_dir: Path, *, load_1m: float = 0.0) -> Phases:
    """Splits a closed run's wall time into phases, from run.json and results.jsonl alone."""
    rundir = RunDir(run_dir)
    info = rundir.read_info()
    if info is None:
        raise ValueError(f"{run_dir} has no readable run.json: not a run directory")
    results = sorted((r for r in rundir.results() if r.started_at), key=lambda r: r.started_at)
    start, end = _time(info.started_at), _time(info.ended_at or info.started_at)
    by_kind = {"compiled": 0.0, "eager": 0.0, "other": 0.0}
    between = 0.0
    previous_end = None
    for r in results:
        began = _time(r.started_at)
        by_kind[_kind(r.test_id)] += r.duration_s
        if previous_end is not None:
            between += max(0.0, began - previous_end)
        previous_end = began + r.duration_s
    first = _time(results[0].started_at) if results else end
    slowest = sorted(((r.test_id.rsplit("::", 1)[-1], round(r.duration_s, 1)) for r in results),
                     key=lambda x: -x[1])[:10]
    return Phases(run_dir=str(run_dir), wall_s=round(end - start, 1), provision_s=round(first - start, 1),
                  compiled_s=round(by_kind["compiled"], 1), eager_s=round(by_kind["eager"], 1),
                  other_s=round(by_kind["other"], 1), between_s=round(between, 1),
                  closing_s=round(max(0.0, end - (previous_end or end)), 1), tests=len(results), load_1m=load_1m,
                  slowest=slowest)


def _children_cpu_s() -> float:
    usage = os.times()
    return usage.children_user + usage.children_system


def _newest_run(runs_root: Path, before: set[Path]) -> Path:
    made = [p for p in runs_root.iterdir() if p.is_dir() and p not in before and (p / "run.json").exists()]
    if not made:
        raise RuntimeError(f"the pr tier run left no run directory under {runs_root}")
    return max(made, key=lambda p: p.stat().st_mtime)


def run_pr_bench(console, *, runs: int = 2, runs_root: Path = REPO / ".distci" / "runs") -> int:
    """Runs the pr tier `runs` times through `python -m distci run` and prints each run's phases."""
    from rich.table import Table

    runs_root.mkdir(parents=True, exist_ok=True)
    measured: list[Phases] = []
    for attempt in range(runs):
        before = set(runs_root.iterdir())
        load = os.getloadavg()[0]
        console.print(f"pr tier, run {attempt + 1} of {runs} (load {load:.1f}) ...")
        started, cpu_before, entries_before = time.monotonic(), _children_cpu_s(), graph_entries(REPO / default_root())
        proc = subprocess.run([sys.executable, "-m", "distci", "run", "--tier", "pr", "--runs-root", str(runs_root)],
                              cwd=REPO)
        console.print(f"  exit {proc.returncode} after {time.monotonic() - started:.0f} s")
        phases = phases_of(_newest_run(runs_root, before), load_1m=load)
        phases.cpu_s = round(_children_cpu_s() - cpu_before, 1)
        entries_after = graph_entries(REPO / default_root())
        phases.new_graphs = {cache: entries_after[cache] - entries_before[cache] for cache in entries_after}
        measured.append(phases)
    table = Table(title="pr tier: where the time goes (s)")
    for column in ("run", "wall", "provision", "compiled", "eager", "other", "between", "closing", "tests", "load",
                   "CPU-s", "new FX graphs", "new AOT entries"):
        table.add_column(column, justify="right")
    for i, p in enumerate(measured, 1):
        table.add_row(str(i), f"{p.wall_s:.0f}", f"{p.provision_s:.0f}", f"{p.compiled_s:.0f}", f"{p.eager_s:.0f}",
                      f"{p.other_s:.0f}", f"{p.between_s:.0f}", f"{p.closing_s:.0f}", str(p.tests), f"{p.load_1m:.1f}",
                      f"{p.cpu_s:.0f}", str(p.new_graphs.get("fxgraph", 0)), str(p.new_graphs.get("aotautograd", 0)))
    console.print(table)
    console.print("slowest tests of the last run: " + ", ".join(f"{t} {s}s" for t, s in measured[-1].slowest))
    out = REPO / ".distci" / "bench-pr.json"
    out.write_text(json.dumps([asdict(p) for p in measured], indent=1))
    console.print(f"written {out}")
    warm = measured[-1].wall_s
    console.print(f"goal (warm pr tier <= {GOAL_WARM_S:.0f} s on 2 idle cores): "
                  + ("met" if warm <= GOAL_WARM_S else f"NOT met ({warm:.0f} s)"))
    return 0
