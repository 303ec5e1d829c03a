"""A cell's baseline, end to end: declared in matrix.toml, written into run.json by the run
that starts, read by ingest, and judged by: a test new to a nightly cell that fails where
the release cell passes is a `regression` (with the release run it was judged against),
not a plain `fail` that nobody bisects."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from fixtures_runs import result, stack, write_run

from distci.judge.ingest import ingest
from distci.judge.store import Store
from distci.matrix import load_matrix
from distci.run.cellrun import start_run
from distci.rundir import STACK_FILE, RunDir

MATRIX = """\
schema = 1

[defaults]
tiers = ["nightly"]
torchao = "0.18.0"

[accelerators.cpu]
backend = "gloo"
runner = ["ubuntu-latest"]
archs = ["x86_64"]
variants = ["cpu"]

[[matrix]]
accelerator = "cpu"
torch = ["2.13.0", "nightly"]

[tiers.nightly]
"""
RELEASE = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
NIGHTLY = "cpu-cpu-torch_nightly-ao_0.18.0-ws2-fix_on"
TEST = "suites/test_tp.py::test_tp_loss_matches_reference[colwise-rowwise]"
T0 = datetime(2026, 11, 20, 2, 0, tzinfo=timezone.utc)


def _nightly_verdict(tmp_path: Path, matrix_text: str) -> tuple[str, str | None, str | None]:
    """The release cell passes TEST; then the nightly cell's run, started by the runner from
    the matrix's cell, fails it on its first night. (verdict, judged against, run.json's baseline)."""
    tmp_path.mkdir()
    (tmp_path / "matrix.toml").write_text(matrix_text)
    cell = load_matrix(tmp_path / "matrix.toml").cell(NIGHTLY)
    runs = tmp_path / "runs"
    release_run = write_run(runs, "release-1", RELEASE, [{"test_id": TEST}], started_at=T0,
                            stack=stack("2.13.0", "a" * 40), tier="nightly")
    info, run_dir = start_run(cell, runs, tier="nightly", log=lambda m: None)
    nightly_stack = stack("2.16.0.dev20261120", "b" * 40)
    later = (T0 + timedelta(hours=1)).isoformat()
    info.started_at = later
    RunDir(run_dir).append(result(TEST, "failed", run_id=info.run_id, cell_id=NIGHTLY, stack=nightly_stack,
                                  failure_kind="assert", message="AssertionError: loss mismatch", started_at=later))
    (run_dir / STACK_FILE).write_text(json.dumps(nightly_stack, sort_keys=True))
    info.ended_at = (T0 + timedelta(hours=2)).isoformat()
    RunDir(run_dir).write_info(info)
    written = json.loads((run_dir / "run.json").read_text()).get("baseline_cell")

    db = tmp_path / "store.sqlite"
    ingest([runs], db)
    with Store(db) as store:
        (row,) = store.results(run_id=info.run_id)
    assert release_run.name == "release-1"
    return row.verdict, row.compared_run, written


def test_a_nightly_cell_is_judged_against_its_declared_baseline(tmp_path: Path) -> None:
    declared = MATRIX + f'\n[[include]]\nmatch = {{torch = "nightly"}}\nbaseline = "{RELEASE}"\n'
    verdict, against, written = _nightly_verdict(tmp_path / "with", declared)
    assert (verdict, against, written) == ("regression", "release-1", RELEASE)


def test_without_a_baseline_a_first_failure_is_a_plain_fail(tmp_path: Path) -> None:
    verdict, against, written = _nightly_verdict(tmp_path / "without", MATRIX)
    assert (verdict, against, written) == ("fail", None, None)
