"""A run's batches in one pytest session (distci/run/batches.py, distci/harness/batches.py).

The fuzzer hands a cell's pytest one batch at a time; these tests drive a BatchSession over a
small entry module (parametrized from a file named in the environment, as the generators'
entry tests are) on 2 real gloo ranks and check what the session must hold: one pytest and
one rank pool start for every batch, each batch's results in the run directory when `run`
returns, and crash safety: a batch whose rank dies is recorded and the next test runs clean
in the same session; a batch whose pytest dies ends the session, and the next batch starts
a new one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from distci.rundir import RunDir  # noqa: E402

ENTRY = '''
import json
import os
import signal
from pathlib import Path


def pytest_generate_tests(metafunc):
    cases = Path(os.environ["BATCH_CASES"])
    cases.with_name("pytest.pid").write_text(str(os.getpid()))  # the session's pytest (collects here)
    metafunc.parametrize("case", json.loads(cases.read_text()))


def test_case(dist, case):
    if case == "rank_dies" and dist.rank == 1:
        os._exit(9)
    if case == "pytest_dies" and dist.rank == 0:
        os.kill(int(Path(os.environ["BATCH_CASES"]).with_name("pytest.pid").read_text()), signal.SIGKILL)
    assert case != "fails", "a failing case"


def test_other(case):
    assert case != "fails_other", "a failing case of the other test"
'''


@pytest.fixture
def session(tmp_path):
    import sys

    from distci.matrix import load_matrix
    from distci.run.batches import BatchSession
    from distci.run.cellrun import REPO, start_run

    cell = next(c for c in load_matrix(REPO / "matrix.toml").cells if c.accelerator == "cpu" and c.world_size == 2)
    entry = tmp_path / "test_entry.py"
    entry.write_text(ENTRY)
    info, run_dir = start_run(cell, tmp_path / "runs", tier="pr", log=lambda m: None)
    lines: list[str] = []
    s = BatchSession(cell, Path(sys.executable), info, run_dir, entry_test=f"{entry}::test_case",
                     extra_args=["--distci-reruns=0"], directory=run_dir / "sessions", log=lines.append)
    yield s
    s.close(interrupted=True)


def run_batch(session, n: int, cases: list[str], tests: list[str] | None = None,
              test: str = "test_case") -> dict[str, tuple[str, str | None]]:
    """Runs one batch; (outcome, failure kind) of each of its cases that has a Result of
    `test`, by case."""
    path = session.run_dir / f"batch-{n}.json"
    path.write_text(json.dumps(cases))
    session.run({"BATCH_CASES": str(path)}, tests=tests)
    found = {r.test_id.rsplit("[", 1)[1].rstrip("]"): (r.outcome, r.failure_kind)
             for r in RunDir(session.run_dir).results() if f"::{test}[" in r.test_id}
    return {c: found[c] for c in cases if c in found}


def pool_starts(run_dir: Path) -> int:
    return (run_dir / "logs" / "ws2-rank0.log").read_text().count("===== distci pool generation")


@pytest.mark.slow
def test_a_runs_batches_share_one_pytest_and_one_rank_pool_and_run_the_functions_they_name(session):
    """Batches share one pytest and one rank pool. The ops generator's sweeps and its finds'
    replay are two test functions of one module: a batch naming `tests` runs those only; a
    batch naming none, the first batch's functions (one session for both claims: a session's
    start, its pytest and its pool, is most of what this file costs)."""
    assert run_batch(session, 1, ["a", "b"]) == {"a": ("passed", None), "b": ("passed", None)}
    pid = session.proc.pid
    assert run_batch(session, 2, ["c", "fails"]) == {"c": ("passed", None), "fails": ("failed", "assert")}
    assert run_batch(session, 3, ["d"]) == {"d": ("passed", None)}
    assert session.proc.pid == pid and session.sessions == 1
    assert pool_starts(session.run_dir) == 1, "the rank pool started again for a later batch"

    assert run_batch(session, 4, ["e"], test="test_other") == {}  # not the first batch's function
    other = f"{session.entry_test.split('::')[0]}::test_other"
    assert run_batch(session, 5, ["g", "fails_other"], tests=[other], test="test_other") == {
        "g": ("passed", None), "fails_other": ("failed", "assert")}
    assert run_batch(session, 6, ["h"], tests=[other], test="test_case") == {}  # not named
    assert session.proc.pid == pid and session.sessions == 1
    assert pool_starts(session.run_dir) == 1, "the rank pool started again for a later batch"
    tests = [r.test_id.rsplit("::", 1)[1] for r in RunDir(session.run_dir).results()]
    assert tests == ["test_case[a]", "test_case[b]", "test_case[c]", "test_case[fails]", "test_case[d]",
                     "test_case[e]", "test_other[g]", "test_other[fails_other]", "test_other[h]"], tests

    proc = session.proc
    session.close()
    assert proc.returncode == 1  # pytest's own code: a test failed
    info = json.loads((session.run_dir / "run.json").read_text())
    assert info["pytest_exit"] == 1
    assert len(RunDir(session.run_dir).results()) == len(tests)  # closing added and lost none


@pytest.mark.slow
def test_a_dead_rank_or_a_dead_pytest_is_recorded_and_the_next_batch_starts_clean(session):
    first = run_batch(session, 1, ["rank_dies", "after"])
    assert first == {"rank_dies": ("failed", "crash"), "after": ("passed", None)}, first
    assert session.sessions == 1 and session.up  # the harness rebuilt its pool inside the session
    second = run_batch(session, 2, ["pytest_dies", "never_ran"])
    assert "never_ran" not in second and not session.up, second  # the session ended with its pytest
    info = json.loads((session.run_dir / "run.json").read_text())
    assert info["pytest_exit"] == -9, info  # closed as a run's pytest is: how it ended is on record
    assert run_batch(session, 3, ["clean"]) == {"clean": ("passed", None)}
    assert session.sessions == 2
