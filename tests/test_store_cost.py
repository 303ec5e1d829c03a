"""What tonight's ingest and the gate cost does not grow with the history behind them.

Both once read every result of every run (the gate's coverage and its fuzz carry-forward,
ingest's full recompute of a cell at each run): fine on a week, minutes at a year. Time is
no measure in a test (a loaded runner doubles it), so the work is counted where it is done:
SQLite's virtual machine steps (`set_progress_handler`) and the statements run
(`set_trace_callback`), for the same night's work on a short and on a three times longer
history of the same generated matrix (distci.bench.history: deterministic for its seed).
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import pytest

from distci.bench.history import START, History, Shape, generate
from distci.judge.gate import evaluate
from distci.judge.ingest import ingest_runs
from distci.judge.store import Store

SHORT, LONG = 15, 45
"""Nights of history before the measured one: both past the verdicts' window (10 runs)."""
STEP = 100
"""SQLite calls the progress handler every STEP virtual machine instructions."""
GROWTH = 1.1
"""How much more the same night may cost on three times the history: none, but for the
odd extra row a longer history's flaky tests bring."""


@dataclass
class Work:
    steps: int = 0
    statements: int = 0


@contextmanager
def counted(conn: sqlite3.Connection) -> Iterator[Work]:
    """The SQLite work done on `conn` inside the block."""
    work = Work()

    def step() -> int:
        work.steps += STEP
        return 0  # go on

    def statement(_sql: str) -> None:
        work.statements += 1

    conn.set_progress_handler(step, STEP)
    conn.set_trace_callback(statement)
    try:
        yield work
    finally:
        conn.set_progress_handler(None, STEP)
        conn.set_trace_callback(None)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return generate(tmp_path_factory.mktemp("history"), Shape(nights=LONG + 1, cells=4, tests=8, seed=1))


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> History:
    """Runs of 48 tests: reading a run's results costs well above reading its run row."""
    return generate(tmp_path_factory.mktemp("wide"), Shape(nights=LONG, cells=4, tests=48, seed=1))


def _nights(history: History) -> list[Path]:
    return list(history.night_groups())


def _tonight(store_path: Path, night: Path) -> tuple[Work, int]:
    """Tonight's ingest as the nightly job runs it: a new process, so a new connection
    that remembers nothing of earlier ingests."""
    with Store(store_path) as store, counted(store.conn) as work:
        report = ingest_runs(store, [night])
    assert not report.rejected and not report.bad_lines
    return work, report.results


def test_tonights_ingest_reads_the_same_however_long_the_history(tmp_path: Path, history: History) -> None:
    nights, db = _nights(history), tmp_path / "store.sqlite"
    with Store(db) as store:
        ingest_runs(store, nights[:SHORT])
    short, short_results = _tonight(db, nights[SHORT])
    with Store(db) as store:
        ingest_runs(store, nights[SHORT + 1:LONG])
    long, long_results = _tonight(db, nights[LONG])
    assert short_results == long_results == 4 * 8, "the same night's work: every cell ran every test"
    assert long.steps <= GROWTH * short.steps, (short, long)
    assert long.statements <= GROWTH * short.statements, (short, long)
    # Per result: its INSERT and a bounded walk of its state, not the cell's history.
    assert long.statements <= 6 * long_results, long


def test_the_gate_reads_a_row_per_run_not_the_results_of_old_runs(tmp_path: Path, wide: History) -> None:
    """The gate walks a cell's runs back to its latest complete one and, on the stack it
    holds, asks each earlier run for its fuzz rows (a key range): a run row and a seek
    per run of history, never the run's results. Three times the history may add that
    per run, and less than a quarter of what reading each added run's results costs."""
    nights, db = _nights(wide), tmp_path / "store.sqlite"

    def gate_after(n: int) -> tuple[Work, str]:
        with Store(db) as store, counted(store.conn) as work:
            answer = evaluate(store, "nightly", matrix_path=wide.matrix,
                              now=START + timedelta(days=n - 1, hours=12))
        return work, answer.status

    with Store(db) as store:
        ingest_runs(store, nights[:SHORT])
    short, short_status = gate_after(SHORT)
    with Store(db) as store:
        ingest_runs(store, nights[SHORT:LONG])
        added = [r for r in store.runs() if r.started_at >= (START + timedelta(days=SHORT)).isoformat()]
        with counted(store.conn) as reading:
            for run in added:
                store.results(run_id=run.run_id)
    long, long_status = gate_after(LONG)
    assert short.steps > 0 and short_status == long_status
    assert len(added) == 4 * (LONG - SHORT)
    assert long.steps - short.steps < reading.steps / 4, (short, long, reading)
    assert long.statements - short.statements <= 2 * len(added), (short, long)
