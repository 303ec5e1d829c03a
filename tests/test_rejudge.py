"""Incremental verdicts (distci.judge.rejudge) give a full recompute's answers, whatever the
order and batching of the ingests, and tonight's ingest reads tonight's results, not the year.

Histories are drawn from a seed over three cells (one the other two's baseline) and six
tests, with every outcome verdicts tell apart: passes, failures with and without reruns,
in-run flaky, skips, infra, known issues, two stacks, runs started at the same second,
narrowed runs holding a few tests, a run that grows after its first ingest and one whose
run.json moves it earlier in history.
"""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fixtures_runs import stack, write_run

from distci.judge import verdicts as verdicts_mod
from distci.judge.ingest import ingest_runs
from distci.judge.store import Store

T0 = datetime(2026, 5, 1, 2, 0, tzinfo=timezone.utc)
BASE = "cuda-cu130-torch_2.14.1-ao_0.18.0-ws2-fix_on"
CELLS = (BASE, "cuda-cu130-torch_nightly-ao_nightly-ws2-fix_on", "cuda-cu130-torch_nightly-ao_nightly-ws2-fix_off")
TESTS = tuple(f"suites/test_tp.py::test_case[{i}]" for i in range(6))
STACKS = (stack(torch_git="a" * 40), stack(torch_git="b" * 40))


def _outcome(rng: random.Random) -> dict:
    roll = rng.random()
    if roll < 0.45:
        return {"outcome": "passed"}
    if roll < 0.60:
        return {"outcome": "failed", "failure_kind": "assert", "message": "AssertionError: loss"}
    if roll < 0.68:
        return {"outcome": "failed", "failure_kind": "assert", "message": "AssertionError: loss",
                "rerun_outcomes": [rng.choice(["passed", "failed"])]}
    if roll < 0.76:
        return {"outcome": "skipped"}
    if roll < 0.82:
        return {"outcome": "error", "failure_kind": "infra", "message": "InfraError: runner lost"}
    if roll < 0.90:
        return {"outcome": "failed", "failure_kind": "exception", "message": "RuntimeError: bug",
                "known_issue": "pytorch1-bug"}
    return {"outcome": "passed", "known_issue": "pytorch1-bug"}


def _history(root: Path, seed: int, nights: int = 14) -> list[Path]:
    """Run directories of a drawn history under root, in no particular order."""
    rng = random.Random(seed)
    dirs = []
    for night in range(nights):
        for c, cell in enumerate(CELLS):
            # Same-second starts across and within cells; now and then a narrowed rerun.
            start = T0 + timedelta(days=night, seconds=rng.choice([0, 0, 60 * c]))
            for n in range(1 + (rng.random() < 0.2)):
                tests = TESTS if n == 0 else rng.sample(TESTS, 2)
                rows = [{"test_id": t, **_outcome(rng)} for t in tests]
                baseline = BASE if cell != BASE and rng.random() < 0.8 else None
                dirs.append(write_run(root, f"r{night:02d}-{c}-{n}", cell, rows, started_at=start,
                                      stack=rng.choice(STACKS), baseline_cell=baseline, durable=False))
    return dirs


def _verdicts(store: Store) -> dict:
    return {(r.run_id, r.test_id): (r.verdict, r.compared_run, r.verdict_reason) for r in store.results()}


def _full(store: Store) -> dict:
    store.recompute_verdicts()
    return _verdicts(store)


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2, 3))])
def test_any_order_and_batching_gives_the_full_recompute(tmp_path: Path, seed: int) -> None:
    dirs = _history(tmp_path / "runs", seed)
    rng = random.Random(seed)
    orders = {
        "one call": [dirs],
        "one by one, shuffled": [[d] for d in rng.sample(dirs, len(dirs))],
        "newest first": [[d] for d in sorted(dirs, reverse=True)],
        "random batches": [],
    }
    shuffled, i = rng.sample(dirs, len(dirs)), 0
    while i < len(shuffled):
        k = rng.randint(1, 9)
        orders["random batches"].append(shuffled[i:i + k])
        i += k
    answers = {}
    for name, calls in orders.items():
        with Store(tmp_path / f"{name}.sqlite") as store:
            for call in calls:
                ingest_runs(store, call)
            answers[name] = _verdicts(store)
            assert answers[name] == _full(store), f"{name}: incremental verdicts differ from a full recompute"
    assert len({json.dumps(sorted(a.items())) for a in answers.values()}) == 1
    seen = Counter(v[0] for v in answers["one call"].values())
    # The draw is rich enough to tell the verdicts apart (a history of passes proves nothing).
    assert {"pass", "regression", "fail", "xfail", "fixed", "flaky", "infra", "skip"} <= set(seen), seen


def test_a_run_that_grows_or_moves_is_judged_again_from_its_place(tmp_path: Path) -> None:
    dirs = _history(tmp_path / "runs", seed=7)
    grown = sorted(dirs)[len(dirs) // 2]
    full_lines = (grown / "results.jsonl").read_text().splitlines(keepends=True)
    (grown / "results.jsonl").write_text("".join(full_lines[:2]))  # ingested while still appending
    with Store(tmp_path / "s.sqlite") as store:
        ingest_runs(store, dirs)
        (grown / "results.jsonl").write_text("".join(full_lines))
        assert ingest_runs(store, [grown]).updated == [json.loads((grown / "run.json").read_text())["run_id"]]
        assert _verdicts(store) == _full(store)

        moved = sorted(dirs)[-4]
        info = json.loads((moved / "run.json").read_text())
        info["started_at"] = (T0 + timedelta(days=1, hours=5)).isoformat()  # now early in history
        (moved / "run.json").write_text(json.dumps(info))
        assert ingest_runs(store, [moved]).updated == [info["run_id"]]
        assert _verdicts(store) == _full(store)


@pytest.mark.slow
def test_tonights_ingest_judges_tonight_not_the_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = _history(tmp_path / "runs", seed=3, nights=40)
    last_night = [d for d in dirs if d.name.startswith("r39-")]
    with Store(tmp_path / "s.sqlite") as store:
        ingest_runs(store, [d for d in dirs if d not in last_night])
        fed = []
        judge_history = verdicts_mod.judge_history

        def counting(runs, baseline_runs=(), judged=None, state=None):
            fed.append(sum(len(r.results) for r in [*runs, *baseline_runs]))
            return judge_history(runs, baseline_runs, judged, state)

        monkeypatch.setattr(verdicts_mod, "judge_history", counting)
        report = ingest_runs(store, last_night)
        monkeypatch.undo()
        assert report.results and not report.rejected, report.summary()  # judged, not turned away
        assert _verdicts(store) == _full(store)
    history = sum(len((d / "results.jsonl").read_text().splitlines()) for d in dirs)
    # Per run: its own results, each test's state (a window of 10 and its last informative
    # outcome, in its cell and the baseline cell) and nothing else: not the 40 nights.
    bound = report.results + len(last_night) * len(TESTS) * (verdicts_mod.FLAKY_WINDOW + 4)
    assert sum(fed) <= bound < history, (fed, bound, history)


def _indexes(store: Store) -> set[str]:
    return {r[0] for r in store.conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'results' AND sql IS NOT NULL")}


def _older_store(path: Path, runs: Path, seed: int, nights: int, downgrade: str) -> dict:
    """A store ingested now, then taken back to an older schema by `downgrade` (SQL); the
    verdicts it held before."""
    import sqlite3

    with Store(path) as store:
        ingest_runs(store, _history(runs, seed=seed, nights=nights))
        before = _verdicts(store)
    conn = sqlite3.connect(path)
    conn.executescript(downgrade)
    conn.close()
    return before


def test_a_schema_4_store_loses_its_history_index_and_keeps_its_verdicts(tmp_path: Path) -> None:
    before = _older_store(tmp_path / "s.sqlite", tmp_path / "runs", 12, 5,
                          "CREATE INDEX results_history ON results(cell_id, test_id, run_started_at, run_id); "
                          "PRAGMA user_version = 4;")
    with Store(tmp_path / "s.sqlite") as store:
        assert "results_history" not in _indexes(store)
        assert _verdicts(store) == before == _full(store)


def test_a_store_of_the_previous_schema_is_upgraded_with_the_same_verdicts(tmp_path: Path) -> None:
    before = _older_store(tmp_path / "s.sqlite", tmp_path / "runs", 11, 6,
                          "ALTER TABLE results DROP COLUMN run_started_at; "
                          "CREATE INDEX results_by_cell ON results(cell_id, test_id); PRAGMA user_version = 3;")
    with Store(tmp_path / "s.sqlite") as store:  # migrated in place
        assert store.conn.execute("SELECT COUNT(*) FROM results WHERE run_started_at = ''").fetchone()[0] == 0
        assert _indexes(store) == {"results_by_verdict", "results_by_run_verdict"}
        extra = write_run(tmp_path / "more", "r99-0-0", BASE, [{"test_id": t} for t in TESTS],
                          started_at=T0 + timedelta(days=30), stack=STACKS[0])
        ingest_runs(store, [extra])
        after = _verdicts(store)
        assert {k: v for k, v in after.items() if k[0] != "r99-0-0"} == before
        assert after == _full(store)
    shutil.rmtree(tmp_path / "more")


def _nights(dirs: list[Path], lo: int, hi: int) -> list[Path]:
    return [d for d in dirs if lo <= int(d.name[1:3]) < hi]


def test_what_one_connection_remembers_never_hides_another_writer(tmp_path: Path) -> None:
    """One Store carries each cell's state from night to night (rejudge.Memo); runs that
    landed behind its back, from another connection or without verdicts, are still seen."""
    dirs = _history(tmp_path / "runs", seed=5, nights=24)
    with Store(tmp_path / "s.sqlite") as one, Store(tmp_path / "s.sqlite") as other:
        ingest_runs(one, [*_nights(dirs, 0, 4), *_nights(dirs, 8, 12)])
        ingest_runs(other, _nights(dirs, 4, 8))  # arriving late, through another writer
        ingest_runs(one, _nights(dirs, 12, 16))
        assert _verdicts(one) == _full(one)
        ingest_runs(one, _nights(dirs, 16, 18), defer_verdicts=True)  # indexed, judged later
        ingest_runs(one, _nights(dirs, 18, 24))
        assert _verdicts(one) == _full(one)


def test_an_ingest_leaves_its_writes_in_the_database_file_not_only_in_the_wal(tmp_path: Path) -> None:
    """Checkpoints are rare while a backfill commits run after run (store.CHECKPOINT_PAGES),
    so the ingest checkpoints at its end: the database file alone, copied while the
    writer's connection is still open (closing it would checkpoint), holds every result."""
    import sqlite3

    from distci.judge.store import CHECKPOINT_PAGES

    dirs = _history(tmp_path / "runs", seed=13, nights=3)
    with Store(tmp_path / "s.sqlite") as store:
        assert store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == CHECKPOINT_PAGES
        report = ingest_runs(store, dirs)
        shutil.copyfile(tmp_path / "s.sqlite", tmp_path / "file-only.sqlite")
    conn = sqlite3.connect(tmp_path / "file-only.sqlite")
    try:
        assert conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] == report.results > 0
    finally:
        conn.close()
