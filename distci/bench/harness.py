"""`nox -s bench -- harness`: what the rank pool's isolation costs; and the bench dispatcher.

`harness`: the same tests four ways: the rank pool (each test in a fresh fork of the warm
rank workers: nothing a test does reaches the next), the pool in place
(`--distci-no-isolation`: every test in the workers themselves, one process group),
plain `torchrun --nproc-per-node 2 -m pytest` (one process group, nothing isolated: what
a project without distci runs; distci.bench.plain gives the tests `dist`), and one
torchrun launch per test (isolated, but every launch spawns, imports torch and meets
anew). Goals (issue 41): the pool within 1.2x plain torchrun and at least 8x faster than
one torchrun per test, on the trivial tests. docs/benchmarks.md keeps the figures.

`provision`: the default CPU cell's environment, cold and warm (distci.bench.provision).

`store`: ingest, gate and dashboard on a generated history at 1x, 10x and 100x today
(distci.bench.store).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from distci.rundir import RunDir
from distci.run.cellrun import QUIET_PLUGINS

REPO = Path(__file__).resolve().parents[2]
TRIVIAL = "tests/harness_cases/test_trivial.py"
FIRST_SUITE = "suites/test_tp_mlp.py"


MODES = ("pool", "pool-in-place", "plain-torchrun", "torchrun-per-test")
MAX_OVER_PLAIN = 1.2  # the pool's wall time over plain torchrun's, trivial tests
MIN_OVER_PER_TEST = 8.0  # one torchrun per test's wall time over the pool's, trivial tests


@dataclass
class Timing:
    workload: str
    mode: str
    tests: int
    passed: int
    wall_s: float
    median_test_s: float
    cpu_s: float = float("nan")  # user + system seconds of every process of the run (forks included)


def _run_timed(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """Runs `cmd`; its wall seconds and the CPU seconds of its whole tree (every process in it
    is waited for by its parent, so the children's rusage holds them all). On a loaded runner
    the wall time is mostly waiting for a core; the CPU seconds are the work. Every run starts
    with an empty inductor cache of its own: no mode reuses what an earlier run compiled."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="distci-bench-inductor-") as cache:
        proc = subprocess.run(cmd, cwd=REPO, env=dict(_env(), TORCHINDUCTOR_CACHE_DIR=cache), capture_output=True,
                              text=True)
        wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def time_pytest(target: str, mode: str) -> Timing:
    """One pytest run of `target` through the harness (`pool`, `pool-in-place`, `torchrun-per-test`)."""
    harness_mode = {"pool": ["--distci-mode", "pool"], "pool-in-place": ["--distci-mode", "pool", "--distci-no-isolation"],
                    "torchrun-per-test": ["--distci-mode", "torchrun"]}[mode]
    with tempfile.TemporaryDirectory(prefix="distci-bench-") as tmp:
        cmd = [sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-q",
               *harness_mode, "--distci-run-dir", tmp, target]
        proc, wall, cpu = _run_timed(cmd)
        records = [r.to_dict() for r in RunDir(Path(tmp)).results()]
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"pytest failed ({proc.returncode}) on {target} in {mode} mode:\n{proc.stdout[-3000:]}")
    durations = [r["duration_s"] for r in records if r["outcome"] == "passed"]
    # The first pool test also pays the pool's start-up; the median is the steady state.
    return Timing(target, mode, len(records), sum(r["outcome"] == "passed" for r in records), wall,
                  statistics.median(durations) if durations else float("nan"), cpu)


def time_plain_torchrun(target: str, nproc: int = 2) -> Timing:
    """`torchrun --nproc-per-node 2 -m pytest target`: every rank runs every test (rank 0's count)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "pytest",
           "-p", "distci.bench.plain", *QUIET_PLUGINS, "-q", target]
    proc, wall, cpu = _run_timed(cmd)
    summaries = [line for line in proc.stdout.splitlines() if re.search(r"\b(passed|failed)\b.* in [\d.]+s", line)]
    if not summaries:
        raise RuntimeError(f"plain torchrun gave no pytest summary on {target}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")

    def count(word: str) -> int:
        found = re.search(rf"(\d+) {word}", summaries[0])
        return int(found.group(1)) if found else 0

    passed, failed = count("passed"), count("failed")
    return Timing(target, "plain-torchrun", passed + failed, passed, wall, float("nan"), cpu)


def run_harness_bench(console: Console) -> dict:
    rows: list[Timing] = []
    load_before = list(os.getloadavg())
    workloads = [TRIVIAL] + ([FIRST_SUITE] if (REPO / FIRST_SUITE).exists() else [])
    for workload in workloads:
        for mode in MODES:
            console.print(f"bench: {workload} via {mode} ...")
            rows.append(time_plain_torchrun(workload) if mode == "plain-torchrun" else time_pytest(workload, mode))
            console.print(f"bench:   {rows[-1].passed}/{rows[-1].tests} passed in {rows[-1].wall_s:.1f}s, "
                          f"{rows[-1].cpu_s:.1f} CPU-s (load {os.getloadavg()[0]:.1f})")
    table = Table(title="harness: the isolated rank pool vs the pool in place, plain torchrun, torchrun per test")
    for col in ("workload", "mode", "tests", "passed", "wall", "CPU", "median/test"):
        table.add_column(col)
    for t in rows:
        table.add_row(t.workload, t.mode, str(t.tests), str(t.passed), f"{t.wall_s:.1f}s", f"{t.cpu_s:.1f}s",
                      f"{t.median_test_s:.3f}s")
    console.print(table)
    summary: dict = {"load_before": load_before, "cpus": os.cpu_count(),
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for workload in workloads:
        wall = {t.mode: t.wall_s for t in rows if t.workload == workload}
        cpu = {t.mode: t.cpu_s for t in rows if t.workload == workload}
        pool = wall["pool"]
        summary[workload] = {
            "wall_s": {mode: round(w, 2) for mode, w in wall.items()},
            "cpu_s": {mode: round(c, 2) for mode, c in cpu.items()},
            "pool_cpu_over_plain": round(cpu["pool"] / cpu["plain-torchrun"], 2),
            "pool_over_plain": round(pool / wall["plain-torchrun"], 2),
            "pool_over_in_place": round(pool / wall["pool-in-place"], 2),
            "per_test_over_pool": round(wall["torchrun-per-test"] / pool, 2),
            "pool_per_test_s": round(next(t.median_test_s for t in rows if t.workload == workload and t.mode == "pool"), 3),
        }
        console.print(f"{workload}: pool {pool:.1f}s = {summary[workload]['pool_over_plain']}x plain torchrun "
                      f"({summary[workload]['pool_cpu_over_plain']}x its CPU seconds), "
                      f"{summary[workload]['pool_over_in_place']}x the pool in place; one torchrun per test is "
                      f"{summary[workload]['per_test_over_pool']}x the pool")
    summary["load_after"] = list(os.getloadavg())
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
        ok = trivial["pool_over_plain"] <= MAX_OVER_PLAIN and trivial["per_test_over_pool"] >= MIN_OVER_PER_TEST
        console.print(f"goals on the trivial tests (pool <= {MAX_OVER_PLAIN}x plain torchrun, one torchrun per test "
                      f">= {MIN_OVER_PER_TEST}x the pool): " + ("met" if ok else "NOT met")
                      + f"; load {summary['load_before'][0]:.1f} -> {summary['load_after'][0]:.1f} on {summary['cpus']} cpus")
        return 0 if ok else 1
    if what == "provision":
        from distci.bench.provision import run_provision_bench

        return run_provision_bench(console, with_pip=bool(getattr(args, "pip", False)),
                                   keep=bool(getattr(args, "keep", False)))
    if what == "pr":
        from distci.bench.pr import run_pr_bench

        repeat = int(getattr(args, "repeat", 1) or 1)
        return run_pr_bench(console, runs=repeat if repeat > 1 else 2)
    if what == "multinode":
        from distci.bench.multinode import run_multinode_bench

        return run_multinode_bench(console)
    if what == "store":
        from distci.bench.store import DEFAULT_ROOT as DEFAULT_STORE_ROOT, run_store_bench

        scales = tuple(int(x) for x in str(getattr(args, "scales", "1,10,100")).split(",") if x.strip())
        root = Path(getattr(args, "root", None) or DEFAULT_STORE_ROOT)
        return run_store_bench(console, scales=scales, keep=bool(getattr(args, "keep", False)), root=root,
                               ingest_up_to=int(getattr(args, "ingest_up_to", None) or max(scales)))
    if what == "fuzz-ops":
        from distci.bench.fuzz_ops import run_fuzz_ops_bench

        return run_fuzz_ops_bench(console, budget_s=float(getattr(args, "budget_s", None) or 600.0),
                                  fixes=getattr(args, "fixes", None) or "off")
    if what == "fuzz-programs":
        from distci.bench.fuzz_programs import run_fuzz_programs_bench

        return run_fuzz_programs_bench(console, budget_s=float(getattr(args, "budget_s", None) or 600.0),
                                       fixes=getattr(args, "fixes", None) or "off")
    if what == "images":
        from distci.images import bench_images

        bench_images()
        return 0
    raise SystemExit(f"unknown benchmark {what!r}")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Registers `bench` on the hub's subparsers: one command, the bench named by its argument."""
    p = sub.add_parser("bench", help="benchmarks: `harness` (rank pool vs torchrun per test), `images` (cold vs warm "
                       "builds), `provision` (a cell's env, cold and warm), `pr` (the pr tier's phases, cold then warm), "
                       "`store` (ingest, gate, dashboard at 1/10/100x), `multinode` (rendezvous on 2 and 4 simulated "
                       "nodes; the pr rows on 2 nodes x 1 rank against 1 node x 2 ranks), `fuzz-ops` (op cases an hour), "
                       "`fuzz-programs` (training programs an hour)")
    p.add_argument("what", choices=("harness", "images", "provision", "pr", "store", "multinode", "fuzz-ops",
                                    "fuzz-programs"))
    p.add_argument("--budget-s", type=float, default=None,
                   help="fuzz-ops, fuzz-programs: seconds of fuzzing (default 600)")
    p.add_argument("--fixes", choices=("off", "on"), default="off",
                   help="fuzz-ops, fuzz-programs: the cell's fixes mode (default off, as a night runs; on: what "
                        "the fix package buys)")
    p.add_argument("--repeat", type=int, default=1, help="pr: how many runs of the tier (default 2: cold, then warm)")
    p.add_argument("--pip", action="store_true", help="provision: also time the pip fallback install")
    p.add_argument("--keep", action="store_true", help="provision, store: keep what the bench generated")
    p.add_argument("--scales", default="1,10,100", help="store: the scales to measure (default 1,10,100)")
    p.add_argument("--ingest-up-to", type=int, default=None,
                   help="store: scales above this are the largest ingested store grown in SQL (default: ingest all)")
    p.add_argument("--root", default=None, help="store: where the histories and figures.json go (default .distci/bench-store)")
    p.set_defaults(fn=lambda args: run_bench(args.what, args))
    return p
