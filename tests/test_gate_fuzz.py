"""The gate and the fuzzer's configurations: judged, never expected (distci.judge.coverage).

A configuration drawn one night is not drawn the next, so a fuzz id must never make a
cell partial, and a fuzz run must never be the complete run a cell's expected tests come
from; but a fuzz find is a failure like any other: it blocks, and it keeps blocking after
the next complete run (which did not draw it) until a replay of the same configuration
says otherwise, or the cell's stack moves on.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from fixtures_runs import stack, write_run
from test_gate import NEW, NOW, ONE_CELL, RELEASE, T0, TP, F8, failed, matrix_file

from distci.judge import gate
from distci.judge.ingest import ingest
from distci.judge.rows import FUZZ_TESTS, is_fuzz
from distci.judge.store import Store

FIND = f"{FUZZ_TESTS}test_fuzz_config[tp-eager-loss_parallel-eval_inference]"
DRAWN = f"{FUZZ_TESTS}test_fuzz_config[fsdp-eager-ga2]"
LATER = T0 + timedelta(days=1)


def judge(runs: Path, db: Path, matrix: Path) -> gate.GateResult:
    if db.exists():
        db.unlink()
    ingest([runs], db)
    with Store(db) as s:
        return gate.evaluate(s, "release", matrix_path=matrix, now=NOW)


def test_the_fuzzers_ids_agree_with_its_entry_test():
    from suites.generators.space import ENTRY_TEST

    assert FUZZ_TESTS == f"{ENTRY_TEST}::"
    assert is_fuzz(FIND) and not is_fuzz(TP)


def test_a_fuzz_find_blocks_through_the_next_night_until_a_replay_passes(tmp_path: Path) -> None:
    runs, db, matrix = tmp_path / "runs", tmp_path / "store.sqlite", matrix_file(tmp_path, ONE_CELL)
    night = [{"test_id": TP}, {"test_id": F8}]
    write_run(runs, "night1", RELEASE, night, started_at=LATER, stack=NEW, tier="release")
    write_run(runs, "fuzz1", RELEASE, [{"test_id": DRAWN}, failed(FIND, "RuntimeError: aten.cross_entropy_loss")],
              started_at=LATER + timedelta(hours=1), stack=NEW, tier="")
    result = judge(runs, db, matrix)
    cell = result.cells[0]
    assert [i.test_id for i in result.blocking] == [FIND] and result.exit_code == 1
    # the fuzz run (no tier, not narrowed) did not become the complete run: night1 still is
    assert cell.state == "ok" and cell.evidence_runs == ["night1", "fuzz1"]

    # the next night draws other configurations: nothing is missing, the find still blocks
    write_run(runs, "night2", RELEASE, night, started_at=LATER + timedelta(hours=2), stack=NEW, tier="release")
    write_run(runs, "fuzz2", RELEASE, [{"test_id": f"{FUZZ_TESTS}test_fuzz_config[tp-eager-adamw]"}],
              started_at=LATER + timedelta(hours=3), stack=NEW, tier="")
    result = judge(runs, db, matrix)
    cell = result.cells[0]
    assert cell.state == "ok" and cell.missing_tests == [], cell.reason
    assert [(i.test_id, i.run_id) for i in result.blocking] == [(FIND, "fuzz1")]

    # a replay of the configuration (its test id names it) that passes: PASSED
    write_run(runs, "replay", RELEASE, [{"test_id": FIND}], started_at=LATER + timedelta(hours=4), stack=NEW,
              tier="", selection=[FIND])
    result = judge(runs, db, matrix)
    assert result.blocking == [] and result.exit_code == 0, result.to_text()


def test_a_carried_find_is_of_its_stack_only(tmp_path: Path) -> None:
    runs, db, matrix = tmp_path / "runs", tmp_path / "store.sqlite", matrix_file(tmp_path, ONE_CELL)
    write_run(runs, "night1", RELEASE, [{"test_id": TP}], started_at=LATER, stack=NEW, tier="release")
    write_run(runs, "fuzz1", RELEASE, [failed(FIND)], started_at=LATER + timedelta(hours=1), stack=NEW, tier="")
    newer = stack("2.13.2+cpu", "1" * 40)
    write_run(runs, "night2", RELEASE, [{"test_id": TP}], started_at=LATER + timedelta(hours=2), stack=newer,
              tier="release")
    result = judge(runs, db, matrix)
    assert result.blocking == [] and result.cells[0].state == "ok", result.to_text()


def test_a_fuzz_run_alone_is_no_complete_run(tmp_path: Path) -> None:
    runs, db, matrix = tmp_path / "runs", tmp_path / "store.sqlite", matrix_file(tmp_path, ONE_CELL)
    write_run(runs, "fuzz1", RELEASE, [{"test_id": DRAWN}], started_at=LATER, stack=NEW, tier="")
    result = judge(runs, db, matrix)
    assert result.cells[0].state == "partial" and result.exit_code == 3
