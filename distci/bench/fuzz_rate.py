"""What the generators' throughput benches share: run one generator through the product path on
this interpreter's stack, read its rate off the run's report, quote the load beside it.

`nox -s bench -- fuzz-ops` and `-- fuzz-programs` (distci/bench/fuzz_ops.py, fuzz_programs.py)
each give a `run(runs_root) -> (count, seconds, extra)` that fuzzes a CPU cell with fixes off,
seeded "bench" (every run draws the same cases), and this module times it, writes
`.distci/bench-<name>.json` and compares the rate with the issue-40 goal: met on 2 idle cores,
exit 1 when not met (on a shared machine the load average printed beside it says why).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"
"""The bench's cell: torch 2.13.0 (what the bench session installs), fixes off, as a night runs."""

Run = Callable[[Any, Path], "tuple[int, float, dict[str, Any]]"]
"""(cell, runs root) -> (what ran, the seconds it is counted over, more figures for the JSON)."""


def bench_cell():
    from distci.matrix import load_matrix

    return load_matrix(REPO / "matrix.toml").select(cell_ids=[CELL])[0]


def measure_rate(console, *, name: str, noun: str, goal_per_hour: int, run: Run, root: Path | None = None) -> int:
    """Runs `run` once, prints and writes its rate an hour with the load before and after;
    0 when the rate meets `goal_per_hour`, else 1."""
    root = root or REPO / ".distci" / f"bench-{name}"
    load_before = os.getloadavg()
    started = time.monotonic()
    count, seconds, extra = run(bench_cell(), root / "runs")
    per_hour = round(count / seconds * 3600) if seconds > 0 else 0
    summary = {noun: count, "seconds": round(seconds, 1), "per_hour": per_hour,
               "total_s": round(time.monotonic() - started, 1), "cpus": os.cpu_count(),
               "load_before": load_before, "load_after": os.getloadavg(), **extra}
    out = REPO / ".distci" / f"bench-{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1, default=str))
    console.print(f"{count} {noun} in {summary['seconds']} s: {per_hour} {noun}/hour "
                  f"(load {load_before[0]:.1f} -> {summary['load_after'][0]:.1f} on {os.cpu_count()} cpus); "
                  f"written {out}")
    met = per_hour >= goal_per_hour
    console.print(f"goal (>= {goal_per_hour} {noun}/hour on 2 idle cores): " + ("met" if met else "NOT met"))
    return 0 if met else 1
