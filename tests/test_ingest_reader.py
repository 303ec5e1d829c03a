"""The reader process of ingest (distci.judge.runreader): a store ingested with a reader
beside the writer is the store ingested inline, row for row and verdict for verdict, bad
lines, unreadable runs and hostile bytes included; and the reader never outlives the ingest.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fixtures_runs import seed_nights, stack, write_run

from distci.judge.ingest import ingest_runs
from distci.judge.runreader import READER_ENV, READER_MIN_RUNS, PreparedRun, Unreadable, prepared_runs
from distci.judge.store import Store

REGISTRY = Path(__file__).resolve().parents[1] / "suites" / "known_issues.toml"
T0 = datetime(2026, 11, 25, 2, 0, tzinfo=timezone.utc)
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"
HOSTILE = "RuntimeError: rank said " + b"\xff\xfe caf\xc3".decode("utf-8", "surrogateescape") + " \x00\x1b[31m"


def _runs(root: Path) -> list[Path]:
    """seed_nights' history (25 runs: verdicts with history, known issues, infra) plus a run
    with a hostile message and a bad line, and a directory that is no run."""
    seed_nights(root / "runs")
    s = stack("2.13.0+cpu", "5a" * 20)
    odd = write_run(root / "runs", "zz-odd", CELL, [{"test_id": "suites/test_a.py::test_x"},
                                                    {"test_id": "suites/test_a.py::test_y", "outcome": "failed",
                                                     "failure_kind": "exception", "message": HOSTILE}],
                    started_at=T0, stack=s)
    with open(odd / "results.jsonl", "ab") as fh:
        fh.write(b'{"not": "a result"}\n\xff\xfe\n')
    empty = root / "runs" / "zz-no-run"
    empty.mkdir()
    (empty / "results.jsonl").write_bytes(b"[1, 2, 3]\n")
    return [root / "runs"]


def _table(path: Path) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT * FROM results ORDER BY run_id, test_id").fetchall()
    finally:
        conn.close()


def test_a_reader_process_lands_the_same_store_as_reading_inline(tmp_path: Path, monkeypatch) -> None:
    paths = _runs(tmp_path)
    reports = {}
    for mode in ("inline", "reader"):
        if mode == "inline":
            monkeypatch.setenv(READER_ENV, "inline")
        else:
            monkeypatch.delenv(READER_ENV, raising=False)
        with Store(tmp_path / f"{mode}.sqlite") as store:
            reports[mode] = ingest_runs(store, paths, known_issues=REGISTRY)
    inline, reader = reports["inline"], reports["reader"]
    assert len(inline.added) >= READER_MIN_RUNS  # enough runs that the second ingest used a reader
    assert (reader.added, reader.results, reader.rejected, reader.bad_lines) == \
        (inline.added, inline.results, inline.rejected, inline.bad_lines)
    assert any("zz-no-run" in r for r in reader.rejected) and len(reader.bad_lines) >= 2
    rows = _table(tmp_path / "reader.sqlite")
    assert rows == _table(tmp_path / "inline.sqlite")
    assert any("\\udcff\\udcfe caf\\udcc3" in v for row in rows for v in row if isinstance(v, str))  # escaped, kept
    assert {row[5] for row in rows} >= {"pass"}  # judged, not left empty by a deferred path


def test_the_reader_is_a_process_while_it_reads_and_gone_when_the_ingest_stops(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(READER_ENV, raising=False)
    dirs = sorted(p for p in (_runs(tmp_path)[0]).iterdir())
    assert len(dirs) >= READER_MIN_RUNS
    before = set(multiprocessing.active_children())
    read = prepared_runs(dirs, None, None)
    first = next(read)
    during = set(multiprocessing.active_children()) - before
    assert isinstance(first, (PreparedRun, Unreadable)) and len(during) == 1
    read.close()  # the consumer stops early (an exception in the writer ends it the same way)
    assert set(multiprocessing.active_children()) - before == set()
    assert all(not p.is_alive() for p in during)


def test_few_runs_are_read_inline(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(READER_ENV, raising=False)
    s = stack("2.13.0+cpu", "5a" * 20)
    dirs = [write_run(tmp_path, f"r{i}", CELL, [{"test_id": "suites/test_a.py::test_x"}],
                      started_at=T0 + timedelta(days=i), stack=s) for i in range(READER_MIN_RUNS - 1)]
    before = set(multiprocessing.active_children())
    read = prepared_runs(dirs, None, None)
    assert isinstance(next(read), PreparedRun)
    assert set(multiprocessing.active_children()) == before
    assert [p.info.run_id for p in read] == [f"r{i}" for i in range(1, READER_MIN_RUNS - 1)]


@pytest.mark.parametrize("mode", ["inline", "reader"])
def test_a_result_line_of_another_run_is_a_bad_line_in_both_modes(tmp_path: Path, monkeypatch, mode: str) -> None:
    if mode == "inline":
        monkeypatch.setenv(READER_ENV, "inline")
    else:
        monkeypatch.delenv(READER_ENV, raising=False)
    s = stack("2.13.0+cpu", "5a" * 20)
    for i in range(READER_MIN_RUNS):
        write_run(tmp_path / "runs", f"r{i}", CELL, [{"test_id": "suites/test_a.py::test_x"}],
                  started_at=T0 + timedelta(days=i), stack=s)
    stray = (tmp_path / "runs" / "r0" / "results.jsonl").read_bytes().replace(b'"r0"', b'"r9"')
    with open(tmp_path / "runs" / "r1" / "results.jsonl", "ab") as fh:
        fh.write(stray)
    with Store(tmp_path / "s.sqlite") as store:
        report = ingest_runs(store, [tmp_path / "runs"])
    assert len(report.added) == READER_MIN_RUNS and report.results == READER_MIN_RUNS
    assert len(report.bad_lines) == 1 and "belongs to run r9" in report.bad_lines[0]
