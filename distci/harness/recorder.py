"""Writes one Result per test to the run directory while pytest runs.

Lines are appended as each test finishes, so a run killed half way keeps every finished
result. Distributed tests carry what the ranks said (failure kind, per-rank excerpts);
the rest are classified from pytest's own report.

junit.xml is kept whole on disk as the run goes (rewritten atomically when a test starts:
once a test, as the file grows with the run): the tests that finished, the one in flight as
interrupted, the rest as not run. A runner killed at once (SIGKILL: a cancelled job past its grace, a lost machine)
still leaves a JUnit file that says how far the run got; a run that ends normally or is
stopped rewrites it from results.jsonl at the end, as before.

results.jsonl is written when a test ends and junit.xml when the next starts: a kill between
the two leaves the last recorded test shown in junit.xml as interrupted. junit.xml can lag the record by that
one test, never run ahead of it (it never claims a result the record lacks).
"""

from __future__ import annotations

import datetime
import os
import shlex
import sys
import time
import uuid
from pathlib import Path

import pytest

from distci.results import INTERRUPTED, Result, error_signature, write_junit
from distci.rundir import INFRA_PREFIX, RECORD_LOST_EXIT, RecordError, RunDir
from distci.stack import Stack, capture_stack
from distci.harness.outcome import Combined


NOT_RUN = "not run: the run ended before this test started (its runner was killed)"
"""The skip message of a selected test that never started, in the junit.xml kept as the run goes."""


def _repro(cell: str | None, nodeid: str) -> str:
    if cell:
        return f"nox -s dist_tests -- --cell {cell} --test {shlex.quote(nodeid)}"
    return f"python -m pytest -p distci.harness.plugin {shlex.quote(nodeid)}"


class Recorder:
    def __init__(self, config: pytest.Config, run_dir: Path) -> None:
        self.config = config
        self.enabled = config.getoption("--distci-run-dir") is not None
        self.run_dir = run_dir
        self.cell = config.getoption("--distci-cell") or os.environ.get("DISTCI_CELL") or "local"
        self.run_id = config.getoption("--distci-run-id") or time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.stack = Stack()  # captured at session start when recording
        self.combined: dict[str, Combined] = {}
        self.reports: dict[str, list[pytest.TestReport]] = {}
        self.started: dict[str, str] = {}
        self.writer: RunDir | None = None
        self.known_issues = None
        self.current: str | None = None  # the test in flight
        self.current_start = 0.0
        self.interrupted = False
        self.stopped_by = "SIGINT"  # the plugin names SIGTERM/SIGHUP when those stopped the run
        self.session: pytest.Session | None = None
        self.record_error = ""  # set when a Result could not be written: the run ends as infra
        self.lost: Result | None = None
        self.planned: list[str] = []  # the selected tests, in run order
        self.finished: dict[str, Result] = {}

    def remember(self, nodeid: str, combined: Combined) -> None:
        self.combined[nodeid] = combined

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session
        if not self.enabled:
            return
        self.stack = capture_stack()
        self.writer = RunDir(self.run_dir)
        self.writer.write_stack(self.stack)
        registry = self.config.getoption("--distci-known-issues")
        if registry and Path(registry).exists():
            from distci.known_issues import RegistryError, load_registry

            try:
                self.known_issues = load_registry(Path(registry))
            except RegistryError as exc:  # one line (pytest's "ERROR: ..."), never an INTERNALERROR
                raise pytest.UsageError(f"distci: {exc}") from None

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.planned = [item.nodeid for item in session.items]
        self._live_junit()

    def _live_junit(self) -> None:
        """junit.xml as the run stands now (see the module doc); a failed write is left to
        the end of the run to report (it keeps the previous file whole)."""
        if self.writer is None or not self.planned or self.record_error:
            return
        results = list(self.finished.values())
        for nodeid in self.planned:
            if nodeid in self.finished:
                continue
            if nodeid == self.current:
                results.append(Result(
                    run_id=self.run_id, cell_id=self.cell, test_id=nodeid, outcome="error", stack=self.stack,
                    failure_kind="infra", error_signature=f"{INTERRUPTED}the run ended during this test",
                    message="Interrupted: the run ended during this test (its runner was killed before it finished)",
                    repro=_repro(self.cell if self.cell != "local" else None, nodeid),
                    started_at=self.started.get(nodeid, "")))
            else:
                results.append(Result(
                    run_id=self.run_id, cell_id=self.cell, test_id=nodeid, outcome="skipped", stack=self.stack,
                    message=NOT_RUN, repro=_repro(self.cell if self.cell != "local" else None, nodeid)))
        try:
            write_junit(results, self.writer.junit_path, suite_name=self.cell)
        except OSError:
            pass

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        self.started[nodeid] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.current, self.current_start = nodeid, time.monotonic()
        self._live_junit()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        self.current = None
        if self.writer is None:
            return
        result = self.result_for(nodeid)
        if self.record_error:
            return  # the run is stopping: what could not be recorded is named by the infra record
        try:
            self.writer.append(result)
        except RecordError as exc:
            self._lost(result, exc)
            return
        self.finished[nodeid] = result

    def _lost(self, result: Result, exc: RecordError) -> None:
        """A Result could not be written (disk full, file-size limit): stop the run after
        this test, and end it as `infra` naming why, never as test failures."""
        self.record_error = str(exc)
        self.lost = result
        print(f"distci: {exc}; stopping the run (infra)", file=sys.stderr, flush=True)
        if self.session is not None:
            self.session.shouldstop = f"distci: {exc}"

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo) -> None:
        """The run was stopped (Ctrl-C, or SIGTERM/SIGHUP through the plugin): the test in
        flight gets an `Interrupted` infra Result, so the record says where the run ended."""
        self.interrupted = True
        nodeid, self.current = self.current, None
        if nodeid is None or self.writer is None:
            return
        self.reports.pop(nodeid, None)
        self.combined.pop(nodeid, None)
        message = f"Interrupted: the run was stopped ({self.stopped_by}) during this test, before it finished"
        self._append_quietly(Result(
            run_id=self.run_id, cell_id=self.cell, test_id=nodeid, outcome="error", stack=self.stack,
            failure_kind="infra", error_signature=f"{INTERRUPTED}stopped by {self.stopped_by}", message=message,
            duration_s=round(time.monotonic() - self.current_start, 3),
            repro=_repro(self.cell if self.cell != "local" else None, nodeid),
            started_at=self.started.get(nodeid, ""), log_path=str(self.run_dir / "logs"),
        ))

    def result_for(self, nodeid: str) -> Result:
        """The Result of a finished test: what the ranks said (a distributed test's Combined)
        where they failed, else pytest's own reports, built by Combined.to_result."""
        reports = self.reports.pop(nodeid, [])
        combined = self.combined.pop(nodeid, None)
        if combined is None or combined.outcome not in ("failed", "error"):
            outcome, kind, message, signature = "passed", None, "", None
            for rep in reports:
                if rep.skipped:
                    outcome = "skipped"
                    message = _skip_reason(rep)
                elif rep.failed:
                    outcome = "failed" if rep.when == "call" else "error"
                    message = rep.longreprtext
                    kind, signature = _classify(rep)
                    break
            # the ranks' time where they ran it: a pool's start-up is not the test's
            duration = combined.duration_s if combined is not None else sum(r.duration for r in reports)
            combined = Combined(outcome, kind, "", message, signature, ranks=combined.ranks if combined else [],
                                duration_s=duration, attempts=combined.attempts if combined else [],
                                load=combined.load if combined else None)
        return combined.to_result(
            run_id=self.run_id, cell_id=self.cell, test_id=nodeid, stack=self.stack,
            repro=_repro(self.cell if self.cell != "local" else None, nodeid),
            started_at=self.started.get(nodeid, ""), log_path=str(self.run_dir / "logs"), registry=self.known_issues,
        )

    def _append_quietly(self, result: Result) -> bool:
        assert self.writer is not None
        try:
            self.writer.append(result)
            return True
        except RecordError as exc:
            if not self.record_error:
                self._lost(result, exc)
            return False

    def infra_record(self) -> Result:
        """The `infra` Result a run that could not record ends with (see RecordError)."""
        lost = self.lost.test_id if self.lost is not None else "?"
        return Result(
            run_id=self.run_id, cell_id=self.cell, test_id=f"{INFRA_PREFIX}{self.cell}", outcome="error",
            stack=self.stack, failure_kind="infra", error_signature=error_signature("RecordError", self.record_error),
            message=f"RecordError: {self.record_error}\nthe result of {lost} and every later test were not recorded",
            repro=_repro(self.cell if self.cell != "local" else None, lost), log_path=str(self.run_dir / "logs"),
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        for line in self.known_issues.stalls() if self.known_issues is not None else []:
            print(f"distci: {line}", file=sys.stderr, flush=True)
        if self.writer is None:
            return
        results = self.writer.results() if self.writer.results_path.exists() else []
        if self.record_error:
            infra = self.infra_record()
            self._append_quietly(infra)  # on a full disk this fails too; JUnit below still says it
            results = [r for r in self.writer.results() if r.test_id != infra.test_id] + [infra]
            session.exitstatus = RECORD_LOST_EXIT
        if not results:
            return
        try:
            write_junit(results, self.writer.junit_path, suite_name=self.cell)
        except OSError as exc:  # written beside and renamed: the old junit.xml (or none) stays whole
            print(f"distci: cannot write {self.writer.junit_path}: {exc}", file=sys.stderr, flush=True)
            session.exitstatus = RECORD_LOST_EXIT


def _skip_reason(rep: pytest.TestReport) -> str:
    longrepr = rep.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _classify(rep: pytest.TestReport) -> tuple[str, str]:
    crash = getattr(rep.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else rep.longreprtext.strip().splitlines()[-1:][0] if rep.longreprtext.strip() else ""
    exc_type, _, msg = text.partition(": ")
    kind = "assert" if exc_type.endswith("AssertionError") or text.startswith("assert ") else "exception"
    return kind, error_signature(exc_type if msg else "Error", msg or text)
