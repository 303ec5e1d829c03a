"""`nox -s bench -- fuzz-ops`: how many op cases an hour the ops generator runs on this machine.

Runs `distci fuzz --generator ops` through the product path on this interpreter's stack
(a CPU cell with fixes off: every sweep, shrink and replay as a night runs them), seeded
"bench" so every run draws the same cases, and reads the rate off its report: cases over
the wall time of the sweeps (pool starts and shrinking included; provisioning and the
finds' replay not, as they do not grow with the budget). The goal is 5,000 cases an hour
on 2 idle cores (issue 40); on a shared machine quote the load average beside it (printed
and written).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOAL_PER_HOUR = 5000
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"


def run_fuzz_ops_bench(console, *, budget_s: float = 600.0, root: Path | None = None) -> int:
    from distci.fuzz.ops_command import fuzz_ops
    from distci.matrix import load_matrix

    root = root or REPO / ".distci" / "bench-fuzz-ops"
    cell = load_matrix(REPO / "matrix.toml").select(cell_ids=[CELL])[0]
    load_before = os.getloadavg()
    started = time.monotonic()
    os.environ.pop("DISTCI_OPS_PLANT", None)
    fuzz_ops(cell, seed="bench", budget_s=budget_s, python=sys.executable, runs_root=root / "runs",
             command=f"nox -s bench -- fuzz-ops (budget {budget_s:.0f}s)", log=console.print)
    report = json.loads(sorted((root / "runs").glob("*/fuzz/ops-report.json"))[-1].read_text())
    summary = {"cases": sum(report["counts"].values()), "sweeps_s": round(report["wall_s"], 1),
               "per_hour": report["per_hour"], "total_s": round(time.monotonic() - started, 1),
               "finds": len(report["finds"]), "counts": report["counts"], "cpus": os.cpu_count(),
               "load_before": load_before, "load_after": os.getloadavg(), "torch": report["stack"].get("torch")}
    out = REPO / ".distci" / "bench-fuzz-ops.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    console.print(f"{summary['cases']} cases in {summary['sweeps_s']} s of sweeps: {summary['per_hour']} cases/hour "
                  f"(load {load_before[0]:.1f} -> {summary['load_after'][0]:.1f} on {os.cpu_count()} cpus); "
                  f"written {out}")
    met = summary["per_hour"] >= GOAL_PER_HOUR
    console.print(f"goal (>= {GOAL_PER_HOUR} cases/hour on 2 idle cores): " + ("met" if met else "NOT met"))
    return 0 if met else 1
