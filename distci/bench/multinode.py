"""`nox -s bench -- multinode`: what spanning hosts costs.

1. Rendezvous and first collective on 2 and 4 simulated nodes (one rank each): every rank
   runs the placement check (`distci.launch.check`), which times the process group's
   rendezvous and the first all-reduce; the launch's wall time includes torchrun's own
   c10d rendezvous of the agents and torch's import.
2. The pr rows on 2 nodes x 1 rank against 1 node x 2 ranks: the latest run of each cell
   under the runs root (`nox -s dist_tests -- --cell ID` makes them), row by row: the same
   outcome on both (a difference is a find), and the time each spent.
Figures go to .distci/bench-multinode.json; docs/multinode.md records them with the date
and the machine's load.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from distci.launch.agents import run_program
from distci.launch.check import T0_ENV
from distci.launch.netns import SimulatedHosts, unavailable
from distci.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
ONE_HOST = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
TWO_HOSTS = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-n2-fix_on"
REPEATS = 3


def time_start(nodes: int, repeats: int = REPEATS) -> dict[str, Any]:
    """Median launch wall time, rendezvous and first collective on `nodes` simulated nodes."""
    walls, rdzv, first = [], [], []
    with SimulatedHosts(nodes) as hosts:
        for _ in range(repeats):
            start = time.time()
            exits = run_program(hosts, hosts.topology(1), ["-m", "distci.launch.check"], timeout_s=300,
                                env={T0_ENV: str(start)})
            walls.append(time.time() - start)
            bad = [e for e in exits if e.returncode != 0]
            if bad:
                raise RuntimeError(f"the placement check failed on {bad[0].hostname}:\n{bad[0].output[-3000:]}")
            ranks = [json.loads(line) for e in exits for line in e.output.splitlines() if line.startswith("{")]
            rdzv.append(max(r["rendezvous_s"] for r in ranks))
            first.append(max(r["first_collective_s"] for r in ranks))
    return {"nodes": nodes, "launch_wall_s": round(statistics.median(walls), 2),
            "rendezvous_s": round(statistics.median(rdzv), 3), "first_collective_s": round(statistics.median(first), 3)}


def latest_run(runs_root: Path, cell_id: str) -> Path | None:
    runs = sorted(p for p in runs_root.glob(f"*-{cell_id}") if (p / "results.jsonl").exists())
    return runs[-1] if runs else None


def compare_runs(one_host: Path, two_hosts: Path) -> dict[str, Any]:
    """Row by row: each run's outcome and duration; `differ` lists the rows whose outcomes disagree."""
    a = {r.test_id: r for r in RunDir(one_host).results()}
    b = {r.test_id: r for r in RunDir(two_hosts).results()}
    both = sorted(set(a) & set(b))
    ran = [t for t in both if "skipped" not in (a[t].outcome, b[t].outcome)]  # rows both can run
    differ = [t for t in ran if a[t].outcome != b[t].outcome]
    return {
        "one_host_run": one_host.name, "two_hosts_run": two_hosts.name, "rows": len(both),
        "both_ran": len(ran), "skipped_on_one_side": sorted(t for t in both if t not in ran),
        "only_one_host": sorted(set(a) - set(b)), "only_two_hosts": sorted(set(b) - set(a)),
        "differ": [{"test": t, "one_host": a[t].outcome, "two_hosts": b[t].outcome} for t in differ],
        "one_host_s": round(sum(a[t].duration_s for t in both), 1),
        "two_hosts_s": round(sum(b[t].duration_s for t in both), 1),
        "outcomes": {t: a[t].outcome for t in both},
    }


def run_multinode_bench(console: Console, runs_root: Path = REPO / ".distci" / "runs") -> int:
    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "load": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    reason = unavailable()
    if reason:
        console.print(f"rendezvous: not measured: {reason}")
    else:
        summary["start"] = [time_start(n) for n in (2, 4)]
        table = Table(title="c10d rendezvous, 1 rank per simulated node (median of 3)")
        for col in ("nodes", "launch wall s", "rendezvous s", "first collective s"):
            table.add_column(col)
        for row in summary["start"]:
            table.add_row(*(str(row[k]) for k in ("nodes", "launch_wall_s", "rendezvous_s", "first_collective_s")))
        console.print(table)
    one, two = latest_run(runs_root, ONE_HOST), latest_run(runs_root, TWO_HOSTS)
    code = 0
    if one and two:
        summary["pr_rows"] = cmp = compare_runs(one, two)
        console.print(f"pr rows, 1 node x 2 ranks ({one.name}) against 2 nodes x 1 rank ({two.name}): "
                      f"{cmp['rows']} rows in both, {cmp['both_ran']} run by both, {len(cmp['differ'])} differ; {cmp['one_host_s']} s against {cmp['two_hosts_s']} s of test time")
        for d in cmp["differ"]:
            console.print(f"  DIFFERENT: {d['test']}: one host {d['one_host']}, two hosts {d['two_hosts']}")
        code = 1 if cmp["differ"] else 0
    else:
        console.print(f"pr rows: no run of {ONE_HOST if not one else TWO_HOSTS} under {runs_root}; "
                      "make both with `nox -s dist_tests -- --cell ID`")
    out = REPO / ".distci" / "bench-multinode.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    console.print(f"written {out}")
    return code
