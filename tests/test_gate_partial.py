"""A `partial` cell names the one cause that holds: a share of a split missing, a run
stopped part-way, tests without a result on the current stack, or a narrowed run; never
a list of what it might be."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from fixtures_runs import stack, write_run
from test_gate import ASYNC, NEW, NOW, RELEASE, T0, TP, WAIT, matrix_file

from distci.judge import gate
from distci.judge.ingest import ingest
from distci.judge.store import Store

DAY = T0 + timedelta(days=1)
CAUSES = ("stopped part-way", "has not run on this stack", "have not run on this stack", "expected tests have no result",
          "was narrowed", "is of tier")
STOPPED = {"test_id": WAIT, "outcome": "error", "failure_kind": "infra", "message": "Interrupted: stopped by SIGINT",
           "error_signature": "Interrupted: stopped by SIGINT"}


def _reason(tmp_path: Path, runs: list[dict]) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    root, db, matrix = tmp_path / "runs", tmp_path / "store.sqlite", matrix_file(tmp_path)
    for i, run in enumerate(runs):
        write_run(root, run.pop("id"), RELEASE, run.pop("results"), started_at=DAY + timedelta(minutes=i),
                  stack=run.pop("stack", NEW), tier=run.pop("tier", "release"), **run)
    ingest([root], db)
    with Store(db) as store:
        (cell,) = gate.evaluate(store, "release", matrix_path=matrix, now=NOW).cells
    assert cell.state == "partial", cell
    named = [c for c in CAUSES if c in cell.reason]
    assert len(named) == 1, cell.reason  # one cause, never a list
    return cell.reason


def test_a_missing_share_is_named_with_its_number(tmp_path: Path) -> None:
    reason = _reason(tmp_path, [{"id": "s1", "results": [{"test_id": TP}], "selection": ["--shard 1/3"]},
                                {"id": "s3", "results": [{"test_id": ASYNC}], "selection": ["--shard 3/3"]}])
    assert "share 2/3 of the split that run s3 (3/3) belongs to has not run on this stack" in reason


def test_a_run_stopped_part_way_is_named_with_the_command_that_finishes_it(tmp_path: Path) -> None:
    reason = _reason(tmp_path, [{"id": "r1", "results": [{"test_id": TP}, STOPPED]}])
    assert reason.startswith("run r1 was stopped part-way")
    assert f"distci run --cell {RELEASE} --resume r1" in reason


def test_tests_missing_on_the_current_stack_are_counted(tmp_path: Path) -> None:
    reason = _reason(tmp_path, [{"id": "full", "results": [{"test_id": TP}, {"test_id": WAIT}]},
                                {"id": "new", "results": [{"test_id": TP}], "selection": [TP],
                                 "stack": stack("2.13.2+cpu", "2" * 40)}])
    assert reason.startswith("1 of 2 expected tests have no result on the current stack (that of run new)")


def test_a_narrowed_or_narrower_run_is_named_as_such(tmp_path: Path) -> None:
    reason = _reason(tmp_path, [{"id": "k", "results": [{"test_id": TP}], "selection": ["-k tp"]}])
    assert "the latest, run k, was narrowed (-k tp)" in reason
    reason = _reason(tmp_path / "2", [{"id": "pr", "results": [{"test_id": TP}], "tier": "pr"}])
    assert "the latest, run pr, is of tier 'pr'" in reason
