"""`nox -s bench -- fuzz-programs`: how many training programs an hour the programs generator runs.

Runs `distci fuzz --generator programs` through the product path on this interpreter's stack
(a CPU cell with fixes off: every batch, shrink candidate and known-issue match as a night
runs them), seeded "bench" so every run draws the same programs, and reads the rate off its
report: programs run (drawn and shrink candidates: each is a whole program on the pool and
its reference) over the run's wall time after provisioning. The goal is 300 programs an hour
on 2 idle cores (issue 40); distci/bench/fuzz_rate.py prints the load average beside it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from distci.bench.fuzz_rate import measure_rate

GOAL_PER_HOUR = 300


def run_fuzz_programs_bench(console, *, budget_s: float = 600.0, root: Path | None = None, fixes: str = "off") -> int:
    from distci.fuzz.programs_cell import fuzz_programs_cell

    def run(cell, runs: Path) -> tuple[int, float, dict]:
        os.environ.pop("DISTCI_PROGRAMS_PLANT", None)
        fuzz_programs_cell(cell, seed="bench", budget_s=budget_s, python=sys.executable, runs_root=runs,
                           command=f"nox -s bench -- fuzz-programs --fixes {fixes} (budget {budget_s:.0f}s)",
                           log=console.print)
        report = json.loads(sorted(runs.glob("*/fuzz/report.json"))[-1].read_text())
        outcomes = [t["outcome"] for t in report["tried"]]
        return len(outcomes), report["wall_s"], {
            "finds": len(report["finds"]), "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
            "shrink_s": round(report["shrink_s"], 1), "torch": report["stack"].get("torch")}

    return measure_rate(console, name="fuzz-programs", noun="programs", goal_per_hour=GOAL_PER_HOUR, run=run,
                        root=root, fixes=fixes)
