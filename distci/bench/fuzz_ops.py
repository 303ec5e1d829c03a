"""`nox -s bench -- fuzz-ops`: how many op cases an hour the ops generator runs on this machine.

Runs `distci fuzz --generator ops` through the product path on this interpreter's stack
(a CPU cell with fixes off: every sweep, shrink and replay as a night runs them; `--fixes on`
runs the fix_on cell, to measure what the fix package buys: dtensor_sdpa_cpu_strategy), seeded
"bench" so every run draws the same cases, and reads the rate off its report: cases over
the wall time of the sweeps (pool starts, resumed slots and shrinking included; provisioning
and the finds' replay not, as they do not grow with the budget). The goal is 5,000 cases an
hour on 2 idle cores (issue 40); distci/bench/fuzz_rate.py prints the load average beside it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from distci.bench.fuzz_rate import measure_rate

GOAL_PER_HOUR = 5000


def run_fuzz_ops_bench(console, *, budget_s: float = 600.0, root: Path | None = None, fixes: str = "off") -> int:
    from distci.fuzz.ops_command import fuzz_ops

    def run(cell, runs: Path) -> tuple[int, float, dict]:
        os.environ.pop("DISTCI_OPS_PLANT", None)
        fuzz_ops(cell, seed="bench", budget_s=budget_s, python=sys.executable, runs_root=runs,
                 command=f"nox -s bench -- fuzz-ops --fixes {fixes} (budget {budget_s:.0f}s)", log=console.print)
        report = json.loads(sorted(runs.glob("*/fuzz/ops-report.json"))[-1].read_text())
        return sum(report["counts"].values()), report["wall_s"], {
            "finds": len(report["finds"]), "counts": report["counts"], "sweeps": report["sweeps"],
            "sessions": report["sessions"],
            "torch": report["stack"].get("torch")}

    return measure_rate(console, name="fuzz-ops", noun="cases", goal_per_hour=GOAL_PER_HOUR, run=run, root=root,
                        fixes=fixes)
