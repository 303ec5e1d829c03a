"""Where distci's own tests spend their time: CPU seconds of the whole process tree, and wall.

On a shared runner (2 cores, load 5-20) a test's wall time is mostly waiting for a core, so a
figure that has to survive the machine is the CPU its process tree used: the pytest process, the
children it already waited for (a `python -m distci run`, pip, a compiler) and the ones still
alive (a rank pool a fixture keeps across tests). Each test is charged what the tree used
between its setup's start and its teardown's end (`procs.cpu_seconds(reaped=True)`); a process
that outlives its parent and is adopted by init is not seen (none should: rule 7).

Walking /proc costs tens of ms on a loaded runner, so only tests in the slow tier (which start
rank workers and envs) walk it; a quick test is charged this process and its waited children
(`os.times`), which is what a quick test's subprocesses are by the time it ends.

The terminal summary prints one line per test file (CPU seconds, wall, tests), heaviest first,
and the tier's totals; `--cpu-report PATH` also writes every test's figures as JSON.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from distci.harness.procs import cpu_seconds

SHOWN_FILES = 25


@dataclass
class TestCost:
    """One test's cost, setup and teardown included."""

    nodeid: str
    cpu_s: float
    wall_s: float


def _tree_cpu(walk: bool) -> float:
    if walk:
        return cpu_seconds([os.getpid()], reaped=True)
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuTime:
    """The plugin: one TestCost per test, summed per file at the end."""

    def __init__(self, report: Path | None) -> None:
        self.report = report
        self.costs: list[TestCost] = []
        self.started = time.monotonic()
        self.cpu_started = _tree_cpu(True)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        walk = item.get_closest_marker("slow") is not None
        cpu, wall = _tree_cpu(walk), time.monotonic()
        yield
        self.costs.append(TestCost(item.nodeid, round(_tree_cpu(walk) - cpu, 2), round(time.monotonic() - wall, 2)))

    def by_file(self) -> list[tuple[str, float, float, int]]:
        files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        for cost in self.costs:
            row = files[cost.nodeid.split("::", 1)[0]]
            row[0] += cost.cpu_s
            row[1] += cost.wall_s
            row[2] += 1
        return sorted(((f, c, w, int(n)) for f, (c, w, n) in files.items()), key=lambda r: -r[1])

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int) -> None:
        total_cpu, wall = _tree_cpu(True) - self.cpu_started, time.monotonic() - self.started
        load = os.getloadavg()[0]
        rows = self.by_file()
        if rows:
            terminalreporter.section("CPU seconds (process tree) and wall by test file")
            for name, cpu, file_wall, count in rows[:SHOWN_FILES]:
                terminalreporter.write_line(f"{cpu:8.1f} CPU-s {file_wall:8.1f} s wall {count:5d} tests  {name}")
            if len(rows) > SHOWN_FILES:
                terminalreporter.write_line(f"... {len(rows) - SHOWN_FILES} lighter files")
            terminalreporter.write_line(f"total: {total_cpu:.0f} CPU-s, {wall:.0f} s wall, {len(self.costs)} tests, "
                                        f"load {load:.1f}")
        if self.report is not None:
            outcomes = {kind: len(terminalreporter.stats.get(kind, ()))
                        for kind in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}
            self.report.parent.mkdir(parents=True, exist_ok=True)
            self.report.write_text(json.dumps({
                "exit_code": int(exitstatus), "outcomes": outcomes, "wall_s": round(wall, 1),
                "total_cpu_s": round(total_cpu, 1), "load_1m": round(load, 1),
                "tests": [asdict(c) for c in self.costs]}, indent=1))
