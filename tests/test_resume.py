"""`distci run --resume`: a cell run stopped part-way is continued, not restarted.

What counts as answered decides what a resumed run leaves out: an interrupted test (infra)
must run again, a failure or a hang must not (it is an answer). One page over the stopped
runs and the resumed one counts every test once, with its latest answer.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import REPO
from fixtures_runs import stack, write_run

from distci.run.resume import done_tests, latest_results, read_resumed
from distci.run.runreport import render
from distci.rundir import RunDirError, read_run

CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"
T0 = datetime(2026, 12, 5, 5, 48, tzinfo=timezone.utc)
S = "suites/test_scenarios.py::test_scenario"


def _stopped(root: Path) -> Path:
    """A shard stopped by SIGINT: three answers and the test in flight."""
    return write_run(root, "r1", CELL, [
        {"test_id": f"{S}[tp-eager]", "outcome": "passed"},
        {"test_id": f"{S}[fsdp-eager]", "outcome": "failed", "failure_kind": "assert",
         "error_signature": "AssertionError: loss differs", "message": "AssertionError: loss differs"},
        {"test_id": f"{S}[hsdp-eager-ws4]", "outcome": "failed", "failure_kind": "hang", "message": "hang"},
        {"test_id": f"{S}[pp-gpipe-eager]", "outcome": "error", "failure_kind": "infra",
         "message": "Interrupted: stopped by SIGINT"},
    ], started_at=T0, stack=stack(), selection=["--shard", "1/2"])


def test_a_failure_or_a_hang_is_an_answer_an_interrupted_test_is_not(tmp_path: Path) -> None:
    runs = read_resumed([_stopped(tmp_path)], CELL)
    assert done_tests(runs) == {f"{S}[tp-eager]", f"{S}[fsdp-eager]", f"{S}[hsdp-eager-ws4]"}


def test_a_timeout_the_runners_load_caused_is_an_answer_only_once_run_again(tmp_path: Path) -> None:
    """A timeout on a saturated runner whose ranks were still computing says nothing about the
    test until it ran again with the longer budget (the harness does that at once; a run
    stopped in between, or one from a harness without the retry, leaves it unanswered)."""
    loaded = {"load1": 41.0, "load5": 39.0, "load15": 30.0, "cpus": 2, "saturated": True, "progressing": True}
    run = write_run(tmp_path, "r1", CELL, [
        {"test_id": f"{S}[tp-eager]", "outcome": "failed", "failure_kind": "timeout", "message": "slow",
         "load": loaded},
        {"test_id": f"{S}[fsdp-eager]", "outcome": "failed", "failure_kind": "timeout", "message": "slow",
         "load": dict(loaded, retried_with_s=900.0)},
        {"test_id": f"{S}[hsdp-eager-ws4]", "outcome": "failed", "failure_kind": "timeout", "message": "slow",
         "load": dict(loaded, progressing=False)},
        {"test_id": f"{S}[pp-gpipe-eager]", "outcome": "failed", "failure_kind": "timeout", "message": "slow",
         "load": dict(loaded, saturated=False)},
    ], started_at=T0, stack=stack())
    assert done_tests(read_resumed([run], CELL)) == {f"{S}[fsdp-eager]", f"{S}[hsdp-eager-ws4]", f"{S}[pp-gpipe-eager]"}


def test_runs_of_another_cell_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match=f"r1: is a run of cell {CELL}, not of cpu-cpu-other"):
        read_resumed([_stopped(tmp_path)], "cpu-cpu-other")


def test_one_page_counts_each_test_once_with_its_latest_answer(tmp_path: Path) -> None:
    stopped = _stopped(tmp_path)
    resumed = write_run(tmp_path, "r2", CELL, [
        {"test_id": f"{S}[pp-gpipe-eager]", "outcome": "passed"},
        {"test_id": f"{S}[pp-1f1b-eager]", "outcome": "passed"},
    ], started_at=T0 + timedelta(hours=1), stack=stack(), selection=["--shard", "1/2", "--resume", "r1"])
    results, left_out = latest_results([read_run(resumed), read_run(stopped)])  # any order given
    by_test = {r.test_id: r for r in results}
    assert left_out == 1 and len(by_test) == 5
    assert by_test[f"{S}[pp-gpipe-eager]"].outcome == "passed" and by_test[f"{S}[pp-gpipe-eager]"].run_id == "r2"

    page = render([stopped, resumed], title="t", command="c")
    assert "1 failed, 1 hang" not in page  # counted by outcome word, once per test
    assert "2 failed, 3 passed; " in page
    assert "1 result(s) left out: a later run answered the same test" in page
    assert page.count(f"| `{S}[pp-gpipe-eager]` |") == 1


def test_an_answer_is_not_replaced_by_a_later_interruption(tmp_path: Path) -> None:
    stopped = _stopped(tmp_path)
    later = write_run(tmp_path, "r3", CELL, [
        {"test_id": f"{S}[tp-eager]", "outcome": "error", "failure_kind": "infra",
         "message": "Interrupted: stopped by SIGINT"},
    ], started_at=T0 + timedelta(hours=2), stack=stack())
    results, _ = latest_results([read_run(stopped), read_run(later)])
    assert {r.test_id: r.outcome for r in results}[f"{S}[tp-eager]"] == "passed"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distci", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_the_command_refuses_runs_of_another_cell_before_provisioning(tmp_path: Path) -> None:
    stopped = _stopped(tmp_path / "runs")
    other = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
    proc = _run("run", "--cell", other, "--resume", str(stopped), "--runs-root", str(tmp_path / "new"))
    assert proc.returncode == 2
    assert f"is a run of cell {CELL}, not of {other}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "new").exists()  # nothing provisioned, no run started
    many = _run("run", "--tier", "nightly", "--resume", str(stopped), "--runs-root", str(tmp_path / "new"))
    assert many.returncode == 2 and "name that cell with --cell" in many.stderr
    missing = _run("run", "--cell", CELL, "--resume", str(tmp_path / "nowhere"), "--runs-root", str(tmp_path / "new"))
    assert missing.returncode == 2 and "nowhere" in missing.stderr and "Traceback" not in missing.stderr


def test_runs_of_another_stack_are_refused_before_provisioning(tmp_path: Path) -> None:
    """A cell id does not pin a stack: answers of torch 2.10 (the fixture's stack) are not
    this release cell's (2.13.0), nor an interpreter's that has another torch."""
    stopped = _stopped(tmp_path / "runs")
    proc = _run("run", "--cell", CELL, "--resume", str(stopped), "--runs-root", str(tmp_path / "new"))
    assert proc.returncode == 2, proc.stderr
    assert "ran torch 2.10.0, outside this cell's torch ==2.13.0" in proc.stderr
    assert not (tmp_path / "new").exists()
    torch = pytest.importorskip("torch")
    installed = "cpu-cpu-torch_installed-ao_0.17.0-ws2-fix_off"
    other = write_run(tmp_path / "runs", "r9", installed, [{"test_id": f"{S}[tp-eager]"}], started_at=T0,
                      stack=stack(torch="1.0.0+cpu"))
    proc = _run("run", "--cell", installed, "--python", sys.executable, "--resume", str(other),
                "--runs-root", str(tmp_path / "new"))
    assert proc.returncode == 2, proc.stderr
    assert f"ran torch 1.0.0; {sys.executable} has {torch.__version__.split('+')[0]}" in proc.stderr
    assert not (tmp_path / "new").exists()
