"""`nox -s bench -- harness`: the rank pool against one torchrun launch per test; and the bench dispatcher.

`harness`: the same tests through the persistent rank pool and through one torchrun
launch per test. The pool exists because a launch (spawn, import torch, rendezvous)
costs seconds while a test message costs milliseconds; this measures both.

`provision`: the default CPU cell's environment, cold and warm (distci.bench.provision).

`store`: ingest, gate and dashboard on a generated history at 1x, 10x and 100x today
(distci.bench.store).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from distci.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
TRIVIAL = "tests/harness_cases/test_trivial.py"
FIRST_SUITE = "suites/test_tp_mlp.py"


@dataclass
class Timing:
    workload: str
    mode: str
    tests: int
    passed: int
    wall_s: float
    median_test_s: float


def time_pytest(target: str, mode: str) -> Timing:
    with tempfile.TemporaryDirectory(prefix="distci-bench-") as tmp:
        cmd = [sys.executable, "-m", "pytest", "-p", "distci.harness", "-p", "no:cacheprovider", "-q",
               "--distci-mode", mode, "--distci-run-dir", tmp, target]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        records = [r.to_dict() for r in RunDir(Path(tmp)).results()]
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"pytest failed ({proc.returncode}) on {target} in {mode} mode:\n{proc.stdout[-3000:]}")
    durations = [r["duration_s"] for r in records if r["outcome"] == "passed"]
    # The first pool test also pays the pool's start-up; the median is the steady state.
    return Timing(target, mode, len(records), sum(r["outcome"] == "passed" for r in records), wall,
                  statistics.median(durations) if durations else float("nan"))


def run_harness_bench(console: Console) -> dict:
    rows: list[Timing] = []
    workloads = [TRIVIAL] + ([FIRST_SUITE] if (REPO / FIRST_SUITE).exists() else [])
    for workload in workloads:
        for mode in ("pool", "torchrun"):
            console.print(f"bench: {workload} via {mode} ...")
            rows.append(time_pytest(workload, mode))
    table = Table(title="harness: rank pool vs torchrun per test")
    for col in ("workload", "mode", "tests", "passed", "wall", "median/test"):
        table.add_column(col)
    for t in rows:
        table.add_row(t.workload, t.mode, str(t.tests), str(t.passed), f"{t.wall_s:.1f}s", f"{t.median_test_s:.3f}s")
    console.print(table)
    summary = {}
    for workload in workloads:
        pool = next(t for t in rows if t.workload == workload and t.mode == "pool")
        run = next(t for t in rows if t.workload == workload and t.mode == "torchrun")
        ratio = run.wall_s / pool.wall_s
        summary[workload] = {"pool_wall_s": round(pool.wall_s, 2), "torchrun_wall_s": round(run.wall_s, 2),
                             "speedup": round(ratio, 2), "pool_per_test_s": round(pool.median_test_s, 3),
                             "torchrun_per_test_s": round(run.median_test_s, 3)}
        console.print(f"{workload}: pool {pool.wall_s:.1f}s, torchrun {run.wall_s:.1f}s, pool is {ratio:.1f}x faster; "
                      f"pool per-test overhead {pool.median_test_s:.3f}s")
    return summary


def run_bench(what: str, args: argparse.Namespace) -> int:
    console = Console()
    if what == "harness":
        summary = run_harness_bench(console)
        out = REPO / ".distci" / "bench-harness.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=1))
        console.print(f"written {out}")
        trivial = summary[TRIVIAL]
        ok = trivial["pool_per_test_s"] <= 0.5 and trivial["speedup"] >= 5
        console.print("goals (per-test overhead <= 0.5 s, pool >= 5x torchrun): " + ("met" if ok else "NOT met"))
        return 0 if ok else 1
    if what == "provision":
        from distci.bench.provision import run_provision_bench

        return run_provision_bench(console, with_pip=bool(getattr(args, "pip", False)),
                                   keep=bool(getattr(args, "keep", False)))
    if what == "pr":
        from distci.bench.pr import run_pr_bench

        repeat = int(getattr(args, "repeat", 1) or 1)
        return run_pr_bench(console, runs=repeat if repeat > 1 else 2)
    if what == "store":
        from distci.bench.store import DEFAULT_ROOT as DEFAULT_STORE_ROOT, run_store_bench

        scales = tuple(int(x) for x in str(getattr(args, "scales", "1,10,100")).split(",") if x.strip())
        root = Path(getattr(args, "root", None) or DEFAULT_STORE_ROOT)
        return run_store_bench(console, scales=scales, keep=bool(getattr(args, "keep", False)), root=root,
                               ingest_up_to=int(getattr(args, "ingest_up_to", None) or max(scales)))
    if what == "fuzz-ops":
        from distci.bench.fuzz_ops import run_fuzz_ops_bench

        return run_fuzz_ops_bench(console, budget_s=float(getattr(args, "budget_s", None) or 600.0))
    if what == "images":
        from distci.images import bench_images

        bench_images()
        return 0
    raise SystemExit(f"unknown benchmark {what!r}")
