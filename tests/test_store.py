"""The store: idempotent, concurrent-safe ingest; rebuildable from the JSONL files."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fixtures_runs import (
    ALL_TESTS,
    INFRA,
    NIGHTLY_OFF,
    REG_TANGENT,
    RELEASE_NPU,
    ingest_after_barrier,
    result,
    seed_nights,
    stack,
    write_run,
)

from distci.rundir import RunDir
from distci.judge.ingest import ingest, rebuild
from distci.rundir import RunInfo
from distci.judge.store import DEFAULT_STORE, Store, StoreError, default_store_path
from distci.judge.rows import BisectRow, suite_of
from distci.judge.ingest import ingest_runs, import_bisects, import_fix_audit

T0 = datetime(2026, 3, 1, 2, 0, tzinfo=timezone.utc)


def _ingested_at(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT run_id, ingested_at FROM runs ORDER BY run_id").fetchall()


def test_ingest_twice_changes_nothing(tmp_path: Path) -> None:
    seeded = seed_nights(tmp_path / "runs", nights=3)
    db = tmp_path / "store.sqlite"
    first = ingest([seeded.root], db)
    assert len(first.added) == 15 and first.results > 100
    with Store(db) as s:
        before = s.snapshot()
    stamps = _ingested_at(db)

    again = ingest([seeded.root], db)
    one_by_one = ingest(sorted(seeded.root.iterdir()), db)
    assert again.added == again.updated == [] and len(again.skipped) == 15
    assert one_by_one.added == one_by_one.updated == []
    with Store(db) as s:
        assert s.snapshot() == before
    assert _ingested_at(db) == stamps
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.slow
def test_eight_parallel_ingests_of_1000_results_lose_none(tmp_path: Path) -> None:
    dirs = []
    for i in range(8):
        cell = f"cuda-cu130-torch_nightly-ws2-fix_{'on' if i % 2 else 'off'}"
        rows = [
            {"test_id": f"suites/test_tp.py::test_case[{k}]", "outcome": "failed" if (k + i) % 97 == 0 else "passed"}
            for k in range(1000)
        ]
        dirs.append(
            write_run(
                tmp_path / "runs",
                f"run{i}",
                cell,
                rows,
                started_at=T0 + timedelta(days=i // 2),
                stack={"torch": "2.11.0", "torch_git": f"{i // 2:040x}"},
                durable=False,
            )
        )
    db = tmp_path / "store.sqlite"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(8)
        with ctx.Pool(8) as pool:
            counts = pool.map(ingest_after_barrier, [(str(d), str(db), barrier) for d in dirs])
    assert counts == [1000] * 8
    with Store(db) as s:
        results = s.results()
        assert len(s.runs()) == 8
        assert len(results) == 8000
        assert all(r.verdict for r in results)
        serial = tmp_path / "serial.sqlite"
        ingest([tmp_path / "runs"], serial)
        with Store(serial) as t:
            assert s.snapshot() == t.snapshot()


def test_delete_and_rebuild_gives_the_same_answers(tmp_path: Path) -> None:
    seeded = seed_nights(tmp_path / "runs", nights=4)
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "2026-03-04.json").write_text(
        json.dumps(
            {
                "cell_id": NIGHTLY_OFF,
                "rows": [
                    {
                        "fix": "act-tangent-coercion",
                        "version": "2.11.0.dev20260304",
                        "present": True,
                        "applied": True,
                        "off": "failed",
                        "on": "passed",
                        "verdict": "needed",
                    }
                ],
            }
        )
    )
    bisect = tmp_path / "bisect" / "tangent"
    bisect.mkdir(parents=True)
    (bisect / "report.json").write_text(
        json.dumps(
            {
                "test_id": REG_TANGENT,
                "axis": "torch-nightly",
                "good": "2026-03-03",
                "bad": "2026-03-04",
                "culprit": "0e797b5a6acf",
                "cell_id": NIGHTLY_OFF,
                "status": "found",
            }
        )
    )
    db = tmp_path / "store.sqlite"
    run_dirs = sorted(seeded.root.iterdir())
    with Store(db) as s:
        ingest_runs(s, run_dirs[len(run_dirs) // 2 :])  # later nights arrive first
        ingest_runs(s, run_dirs[: len(run_dirs) // 2])
        import_fix_audit(s, audit)
        import_bisects(s, tmp_path / "bisect")
        before = s.snapshot()
    assert before["fix_audit"][0]["present"] == "yes" and before["bisects"][0]["culprit"] == "0e797b5a6acf"
    assert {r["verdict"] for r in before["results"]} >= {"pass", "regression", "fail", "xfail", "infra", "skip"}

    db.unlink()
    rebuild(db, seeded.root, audit_dir=audit, bisect_dir=tmp_path / "bisect")
    assert not Path(f"{db}.rebuild").exists()
    with Store(db) as s:
        assert s.snapshot() == before


def test_appended_run_is_reindexed(tmp_path: Path) -> None:
    """A run ingested while still appending grows; append-only growth is re-indexed."""
    st = stack()
    run_dir = write_run(tmp_path, "r1", "cpu-ws2", [{"test_id": t} for t in ALL_TESTS[:3]], started_at=T0, stack=st)
    db = tmp_path / "s.sqlite"
    assert ingest([run_dir], db).added == ["r1"]
    RunDir(run_dir).append(
        result(ALL_TESTS[3], "failed", run_id="r1", cell_id="cpu-ws2", stack=st, message="boom")
    )
    report = ingest([run_dir], db)
    assert report.updated == ["r1"]
    with Store(db) as s:
        assert [r.test_id for r in s.results(run_id="r1")] == sorted(ALL_TESTS[:4])
        assert s.run("r1").n_results == 4


def test_rewritten_run_is_rejected_by_name_and_others_still_ingest(tmp_path: Path) -> None:
    st = stack()
    run_dir = write_run(tmp_path / "a", "r1", "cpu-ws2", [{"test_id": ALL_TESTS[0]}], started_at=T0, stack=st)
    db = tmp_path / "s.sqlite"
    ingest([run_dir], db)
    (run_dir / "results.jsonl").write_text(
        json.dumps(result(ALL_TESTS[0], "failed", run_id="r1", cell_id="cpu-ws2", stack=st).to_dict()) + "\n"
    )
    other = write_run(
        tmp_path / "b", "r2", "cpu-ws2", [{"test_id": ALL_TESTS[0]}], started_at=T0 + timedelta(days=1), stack=st
    )
    with pytest.raises(StoreError, match="run r1") as exc:
        ingest([run_dir, other], db)
    assert exc.value.report.added == ["r2"]  # type: ignore[attr-defined]
    with Store(db) as s:
        assert s.results(run_id="r1")[0].outcome == "passed"
        assert [r.run_id for r in s.runs()] == ["r1", "r2"]


def test_run_without_run_json_is_derived_from_its_results(tmp_path: Path) -> None:
    st = stack("2.11.0.dev20260302+cu130")
    run_dir = write_run(
        tmp_path, "r9", "cuda-nightly", [{"test_id": t} for t in ALL_TESTS[:2]], started_at=T0, stack=st, run_json=False
    )
    with Store(tmp_path / "s.sqlite") as s:
        ingest_runs(s, [tmp_path])
        run = s.run("r9")
    assert run is not None
    assert (run.run_id, run.cell_id, run.nightly_date) == ("r9", "cuda-nightly", "2026-03-02")
    assert run.started_at == T0.isoformat() and run.ended_at > run.started_at
    assert run.source_path == str(run_dir)


def test_run_json_tolerates_unknown_fields() -> None:
    info = RunInfo.from_dict({"run_id": "r", "cell_id": "c", "future_field": 1, "backend": "venv"})
    assert (info.run_id, info.backend, info.tier) == ("r", "venv", "")


def test_infra_never_regresses_and_environment_failures_are_stored(tmp_path: Path) -> None:
    seeded = seed_nights(tmp_path / "runs", nights=3)
    with Store(tmp_path / "s.sqlite") as s:
        ingest_runs(s, [seeded.root])
        infra = s.results(verdicts=["infra"])
        assert {(r.cell_id, r.test_id) for r in infra} >= {(RELEASE_NPU, INFRA + RELEASE_NPU)}
        assert all(r.verdict != "regression" for r in s.results() if r.failure_kind == "infra")
        env = next(r for r in infra if r.test_id == INFRA + RELEASE_NPU)
        assert env.error_signature and "torch_npu" in env.error_signature


def test_bisects_and_store_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTCI_STORE", raising=False)
    assert default_store_path() == DEFAULT_STORE
    monkeypatch.setenv("DISTCI_STORE", str(tmp_path / "x.sqlite"))
    assert default_store_path() == tmp_path / "x.sqlite"
    with Store() as s:
        s.add_bisects([BisectRow("t", "torch-nightly", "2026-03-01", "2026-03-02", "abc")])
        assert s.bisects()[0].culprit == "abc"
    assert (tmp_path / "x.sqlite").exists()


@pytest.mark.parametrize(
    "test_id, suite",
    [
        ("suites/regressions/test_pytorch125932_rowwise_parallel_wait.py::test_x", "regressions"),
        ("suites/test_tp.py::test_tp_loss[colwise]", "tp"),
        ("suites/float8/test_rowwise.py::TestRow::test_a", "float8"),
        ("test_local.py::t", "local"),
    ],
)
def test_suite_of(test_id: str, suite: str) -> None:
    assert suite_of(test_id) == suite


def test_verdicts_are_recomputable(tmp_path: Path) -> None:
    seeded = seed_nights(tmp_path / "runs", nights=3)
    with Store(tmp_path / "s.sqlite") as s:
        ingest_runs(s, [seeded.root])
        before = s.snapshot()
        s.conn.execute("UPDATE results SET verdict = 'pass', compared_run = NULL, verdict_reason = ''")
        assert s.snapshot() != before
        s.recompute_verdicts()
        assert s.snapshot() == before
