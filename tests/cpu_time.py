"""Where distci's own tests spend their time: CPU seconds of the whole process tree, and wall.

On a shared runner (2 cores, load 5-20) a test's wall time is mostly waiting for a core, so a
figure that has to survive the machine is the CPU its process tree used: the pytest process, the
children it already waited for (a `python -m distci run`, pip, a compiler) and the ones still
alive (a rank pool a fixture keeps across tests). Each test is charged what the tree used
between its setup's start and its teardown's end (`procs.cpu_seconds(reaped=True)`); a process
that outlives its parent and is adopted by init is not seen (none should: rule 7).

Walking /proc costs tens of ms on a loaded runner, so only tests in the slow tier (which start
rank workers and envs) walk it, and any test that starts while this process has a live child; a
quick test is otherwise charged this process and its waited children (`os.times`), which is
what a quick test's subprocesses are by the time it ends. A live child at the start is a module
fixture's process (the ops tests' shared session): slow tests charged what it used as it went,
so the test whose teardown reaps it must not be charged its whole life again (os.times would:
test_fuzz_ops.py's last, quick, test was charged the session's ~35 CPU-s a second time).

Under pytest-xdist (`-n N`) the test runs in a worker, so the worker measures it (its own process
tree) and puts the figures on the test's teardown report (`user_properties`: `tier`, `cpu_s`,
`wall_s`, which junit.xml keeps as properties); the controller, which prints, reads them from the
reports. The run's total CPU is the controller's own plus each worker's tree, which each worker
sends back when it ends (`workeroutput`).

The tier of a test (`tier_of`: quick, slow, docker, long) is read from its markers, so one run
over every tier still says what each tier cost: its outcomes, its tests' CPU and wall seconds,
and when its last test ended. Under xdist, where pytest's own progress has no file names, a line
per test file is printed as each file's last test ends. The terminal summary prints one line per
test file (CPU seconds, wall, tests), heaviest first, each tier's totals and the run's;
`--cpu-report PATH` also writes them, with every test's figures, as JSON.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from distci.harness.procs import cpu_seconds

SHOWN_FILES = 25
TIERS = ("quick", "slow", "docker", "long")
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
WORKER_CPU = "distci_tree_cpu_s"  # the key of a worker's total in its workeroutput


def tier_of(item: pytest.Item) -> str:
    """The tier a test belongs to, by its markers (as the noxfile's `-m` expressions select them):
    long (the planted-bug trials) before docker before slow; the rest is quick."""
    for tier in ("long", "docker", "slow"):
        if item.get_closest_marker(tier) is not None:
            return tier
    return "quick"


@dataclass
class TestCost:
    """One test's cost, setup and teardown included."""

    nodeid: str
    cpu_s: float
    wall_s: float
    tier: str = "quick"
    worker: str | None = None


@dataclass
class TierTotals:
    """What one tier of a run cost: outcomes, its tests' CPU and wall seconds, and how far into
    the run its last test ended (with the tiers mixed over workers, a tier has no wall of its own)."""

    outcomes: Counter = field(default_factory=Counter)
    tests: int = 0
    cpu_s: float = 0.0
    test_wall_s: float = 0.0
    done_at_s: float = 0.0


def _tree_cpu(walk: bool) -> float:
    if walk:
        return cpu_seconds([os.getpid()], reaped=True)
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _has_live_child() -> bool:
    """Whether this process has a child now, read from /proc (a wait would reap a child that a
    Popen owns and lose its exit status)."""
    try:
        return any(Path(f"/proc/self/task/{tid}/children").read_text().strip() for tid in os.listdir("/proc/self/task"))
    except OSError:
        return False


def _counts(outcomes: Counter) -> str:
    return ", ".join(f"{outcomes[k]} {k}" for k in OUTCOMES if outcomes.get(k)) or "no outcome"


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


class CpuTime:
    """The plugin: measures each test where it runs; counts, sums and prints where the terminal is."""

    def __init__(self, config: pytest.Config, report: Path | None) -> None:
        self.config = config
        self.report = report
        self.worker = hasattr(config, "workerinput")  # an xdist worker: measures, never prints
        self.distributed = not self.worker and bool(getattr(config.option, "numprocesses", None))
        self.costs: list[TestCost] = []
        self.tiers: dict[str, TierTotals] = defaultdict(TierTotals)
        self.left_in_file: dict[str, int] = {}
        self.file_outcomes: dict[str, Counter] = defaultdict(Counter)
        self.workers_cpu = 0.0
        self.started = time.monotonic()
        self._running: dict[str, tuple[float, float, bool]] = {}

    # -- where the test runs (a worker, or the one pytest process) ---------------------------
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        walk = item.get_closest_marker("slow") is not None or _has_live_child()
        item.user_properties.append(("tier", tier_of(item)))  # before setup: every report carries it
        self._running[item.nodeid] = (_tree_cpu(walk), time.monotonic(), walk)
        yield
        self._running.pop(item.nodeid, None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        if call.when == "teardown" and item.nodeid in self._running:  # the teardown has run: charge it all
            cpu, wall, walk = self._running[item.nodeid]
            item.user_properties.append(("cpu_s", round(_tree_cpu(walk) - cpu, 2)))
            item.user_properties.append(("wall_s", round(time.monotonic() - wall, 2)))
        yield

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.worker:
            session.config.workeroutput[WORKER_CPU] = round(_tree_cpu(True), 2)

    # -- where the terminal is (the controller, or the one pytest process) -------------------
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self.worker:
            self._expect(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        if not self.left_in_file:  # every worker collects the same tests
            self._expect(ids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        self.workers_cpu += float(getattr(node, "workeroutput", {}).get(WORKER_CPU, 0.0))

    def _expect(self, nodeids) -> None:
        for nodeid in nodeids:
            path = nodeid.split("::", 1)[0]
            self.left_in_file[path] = self.left_in_file.get(path, 0) + 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.worker:
            return
        props = dict(report.user_properties)
        tier = str(props.get("tier", "quick"))
        totals = self.tiers[tier]
        category = self.config.hook.pytest_report_teststatus(report=report, config=self.config)[0]
        path = report.nodeid.split("::", 1)[0]
        if category in OUTCOMES:
            totals.outcomes[category] += 1
            self.file_outcomes[path][category] += 1
        if report.when != "teardown" or "cpu_s" not in props:
            return
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None)
        cost = TestCost(report.nodeid, float(props["cpu_s"]), float(props["wall_s"]), tier, worker)
        self.costs.append(cost)
        totals.tests += 1
        totals.cpu_s += cost.cpu_s
        totals.test_wall_s += cost.wall_s
        totals.done_at_s = time.monotonic() - self.started
        if path in self.left_in_file:
            self.left_in_file[path] -= 1
            if self.left_in_file[path] == 0 and self.distributed:
                self._file_done(path, worker)

    def _file_done(self, path: str, worker: str | None) -> None:
        """A line per file as it ends (pytest's own progress under xdist names no file)."""
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None:
            return
        mine = [c for c in self.costs if c.nodeid.split("::", 1)[0] == path]
        counts = _counts(self.file_outcomes[path])
        terminal.currentfspath = -2  # as pytest's own xdist branch marks a line in progress:
        terminal.ensure_newline()    # the progress letters so far end their line first
        terminal.write_line(f"[{worker or '-'}] {path}: {counts}; {sum(c.cpu_s for c in mine):.1f} CPU-s, "
                            f"{sum(c.wall_s for c in mine):.1f} s wall")

    def by_file(self) -> list[tuple[str, float, float, int]]:
        files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        for cost in self.costs:
            row = files[cost.nodeid.split("::", 1)[0]]
            row[0] += cost.cpu_s
            row[1] += cost.wall_s
            row[2] += 1
        return sorted(((f, c, w, int(n)) for f, (c, w, n) in files.items()), key=lambda r: -r[1])

    def total_cpu(self) -> float:
        """The run's CPU seconds from its processes' start (imports and collection are its cost too):
        the process tree; under xdist the controller's own process plus each worker's tree (the
        workers are the controller's children, and each reports its tree as it ends)."""
        if self.distributed:
            return _own_cpu() + self.workers_cpu
        return _tree_cpu(True)

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int) -> None:
        if self.worker:
            return
        total_cpu, wall = self.total_cpu(), time.monotonic() - self.started
        load = os.getloadavg()[0]
        workers = int(self.config.option.numprocesses) if self.distributed else 0
        rows = self.by_file()
        if rows:
            terminalreporter.section("CPU seconds (process tree) and wall by test file")
            for name, cpu, file_wall, count in rows[:SHOWN_FILES]:
                terminalreporter.write_line(f"{cpu:8.1f} CPU-s {file_wall:8.1f} s wall {count:5d} tests  {name}")
            if len(rows) > SHOWN_FILES:
                terminalreporter.write_line(f"... {len(rows) - SHOWN_FILES} lighter files")
            for tier in TIERS:
                if tier in self.tiers:
                    t = self.tiers[tier]
                    counts = _counts(t.outcomes)
                    terminalreporter.write_line(f"tier {tier}: {counts}; {t.cpu_s:.0f} CPU-s, {t.test_wall_s:.0f} s "
                                                f"of tests' wall, last test ended at {t.done_at_s:.0f} s")
            terminalreporter.write_line(f"total: {total_cpu:.0f} CPU-s, {wall:.0f} s wall, {len(self.costs)} tests, "
                                        f"load {load:.1f}" + (f", {workers} workers" if workers else ""))
        if self.report is not None:
            outcomes = {kind: len(terminalreporter.stats.get(kind, ())) for kind in OUTCOMES}
            tiers = {name: {"outcomes": {k: t.outcomes.get(k, 0) for k in OUTCOMES}, "tests": t.tests,
                            "cpu_s": round(t.cpu_s, 1), "test_wall_s": round(t.test_wall_s, 1),
                            "done_at_s": round(t.done_at_s, 1)}
                     for name, t in sorted(self.tiers.items(), key=lambda kv: TIERS.index(kv[0]))}
            self.report.parent.mkdir(parents=True, exist_ok=True)
            self.report.write_text(json.dumps({
                "exit_code": int(exitstatus), "outcomes": outcomes, "wall_s": round(wall, 1),
                "total_cpu_s": round(total_cpu, 1), "load_1m": round(load, 1), "workers": workers,
                "tiers": tiers, "tests": [asdict(c) for c in self.costs]}, indent=1))
