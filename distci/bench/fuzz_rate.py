"""What the generators' throughput benches share: run one generator through the product path on
this interpreter's stack, read its rate off the run's report, quote the load beside it.

`nox -s bench -- fuzz-ops` and `-- fuzz-programs` (distci/bench/fuzz_ops.py, fuzz_programs.py)
each give a `run(runs_root) -> (count, seconds, extra)` that fuzzes a CPU cell (fixes off as a
night runs, or on with `--fixes on`), seeded "bench" (every run draws the same cases), and this
module times it, writes
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
CELLS = {"off": CELL, "on": "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"}
"""By `--fixes`: `on` measures what the fix package buys (docs/benchmarks.md)."""

Run = Callable[[Any, Path], "tuple[int, float, dict[str, Any]]"]
"""(cell, runs root) -> (what ran, the seconds it is counted over, more figures for the JSON)."""


def bench_cell(fixes: str = "off"):
    from distci.matrix import load_matrix

    if fixes not in CELLS:
        raise ValueError(f"fixes {fixes!r}: the benches run with --fixes {' or '.join(CELLS)}")
    return load_matrix(REPO / "matrix.toml").select(cell_ids=[CELLS[fixes]])[0]


def measure_rate(console, *, name: str, noun: str, goal_per_hour: int, run: Run, root: Path | None = None,
                 fixes: str = "off") -> int:
    """Runs `run` once on the bench cell of `fixes` (off | on), prints and writes its rate an hour
    with the load before and after; 0 when the rate meets `goal_per_hour`, else 1."""
    label = name if fixes == "off" else f"{name}-fixes_{fixes}"  # so on and off run back to back keep both
    root = root or REPO / ".distci" / f"bench-{label}"
    load_before = os.getloadavg()
    started = time.monotonic()
    cell = bench_cell() if fixes == "off" else bench_cell(fixes)
    count, seconds, extra = run(cell, root / "runs")
    per_hour = round(count / seconds * 3600) if seconds > 0 else 0
    summary = {noun: count, "seconds": round(seconds, 1), "per_hour": per_hour, "fixes": fixes,
               "total_s": round(time.monotonic() - started, 1), "cpus": os.cpu_count(),
               "load_before": load_before, "load_after": os.getloadavg(), **extra}
    out = REPO / ".distci" / f"bench-{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1, default=str))
    console.print(f"{count} {noun} in {summary['seconds']} s: {per_hour} {noun}/hour "
                  f"(load {load_before[0]:.1f} -> {summary['load_after'][0]:.1f} on {os.cpu_count()} cpus, fixes {fixes}); "
                  f"written {out}")
    met = per_hour >= goal_per_hour
    console.print(f"goal (>= {goal_per_hour} {noun}/hour on 2 idle cores): " + ("met" if met else "NOT met"))
    return 0 if met else 1
