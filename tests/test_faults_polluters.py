"""The fault cases: isolation by construction, against passing tests that change their process in
ways no list in distci names (tests/faults/cases/test_polluters.py), each check proven able to fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from faultrun import CASES, outcome_of, run_cases

pytestmark = pytest.mark.slow


POLLUTERS = CASES / "test_polluters.py"


def _polluter_kinds() -> list[str]:
    import ast

    tree = ast.parse(POLLUTERS.read_text())
    kinds = next(n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "KINDS")
    return [k.value for k in kinds.keys]


def _polluter_run(tmp_path: Path, *args: str) -> tuple[dict, dict[int, str]]:
    (tmp_path / "memo").mkdir()
    _proc, results, _ = run_cases(tmp_path, str(POLLUTERS), "--distci-timeout=30", *args, timeout=1800,
                                  DISTCI_FAULT_DIR=str(tmp_path / "memo"))
    logs = {rank: (tmp_path / "run" / "logs" / f"ws2-rank{rank}.log").read_text(errors="replace") for rank in (0, 1)}
    return results, logs


@pytest.fixture(scope="module")
def polluted_run(tmp_path_factory):
    """Passing tests that change their process in ways no list in distci names, each followed
    by an innocent test (tests/faults/cases/test_polluters.py), one controller."""
    return _polluter_run(tmp_path_factory.mktemp("polluters"))


@pytest.fixture(scope="module")
def polluted_in_place(tmp_path_factory):
    """The same, every test in the rank workers themselves: proves each check can fail."""
    return _polluter_run(tmp_path_factory.mktemp("polluters-in-place"), "--distci-no-isolation")


@pytest.mark.parametrize("kind", _polluter_kinds())
def test_no_state_a_passing_test_leaves_reaches_the_next_test(polluted_run, polluted_in_place, kind):
    results, logs = polluted_run
    assert outcome_of(results[f"test_kind[{kind}-pollute]"]) == ("passed", None)
    check = results[f"test_kind[{kind}-check]"]
    assert outcome_of(check) == ("passed", None), check["message"][:2000]
    for rank, log in logs.items():
        for stream in ("stdout", "stderr", "logging"):
            assert f"innocent {kind} {stream} rank{rank}" in log, f"rank {rank}'s {stream} line of the {kind} check"
    leaky_results, leaky_logs = polluted_in_place
    leaky = leaky_results[f"test_kind[{kind}-check]"]
    markers = all(f"innocent {kind} stdout rank{rank}" in log for rank, log in leaky_logs.items())
    assert leaky["outcome"] == "failed" or not markers, f"the {kind} check cannot fail: {leaky}"


def test_after_every_polluter_a_hang_and_a_crash_still_leave_their_cause(polluted_run):
    results, _logs = polluted_run
    hang = results["test_witness_hang"]
    assert outcome_of(hang) == ("failed", "hang"), hang["message"][:2000]
    stuck = hang["ranks"][0]
    assert "torch/distributed/" in stuck["excerpt"] and "in test_witness_hang" in stuck["excerpt"], stuck["excerpt"][:3000]
    crash = results["test_witness_crash"]
    assert outcome_of(crash) == ("failed", "crash") and "rank 1 killed by SIGSEGV" in crash["message"], crash["message"]
    crashed = crash["ranks"][1]["excerpt"]
    assert "Segmentation fault" in crashed and "in test_witness_crash" in crashed, crashed[-2000:]
