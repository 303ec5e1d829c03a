"""The fault cases: `--distci-reruns` against the known-issue registry, and what a passing test's
ranks leave running.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from faultrun import CASES, outcome_of, run_cases

pytestmark = pytest.mark.slow


def test_a_failure_a_known_issue_explains_is_not_run_again(tmp_path):
    """--distci-reruns reruns an unknown failure only: the one the registry explains is
    recorded as known after one attempt, while the unknown one in the same run is rerun."""
    registry = tmp_path / "known_issues.toml"
    registry.write_text(
        '[[issue]]\nid = "case-always-fails"\ntitle = "the always-failing fault case"\n'
        'tests = ["*test_reruns.py::test_always_fails"]\nsignature = "fails every time"\nupstream = ""\n')
    _proc, results, _ = run_cases(tmp_path, str(CASES / "test_reruns.py"), "-k", "always_fails or first_time",
                                  "--distci-reruns=1", f"--distci-known-issues={registry}")
    known = results["test_always_fails"]
    assert (known["outcome"], known["known_issue"], known["reruns"]) == ("failed", "case-always-fails", 0), known
    flaky = results["test_fails_first_time"]
    assert (flaky["outcome"], flaky["reruns"]) == ("passed", 1), flaky


def test_reruns_and_processes_left_by_a_passing_test(tmp_path):
    (tmp_path / "fault").mkdir()
    _proc, results, _ = run_cases(tmp_path, str(CASES / "test_reruns.py"), str(CASES / "test_leave_processes.py"),
                                  "-k", "not pool_rank and not torchrun_rank", "--distci-reruns=1",
                                  DISTCI_FAULT_DIR=str(tmp_path / "fault"))
    flaky = results["test_fails_first_time"]
    assert outcome_of(flaky) == ("passed", None)
    assert (flaky["reruns"], flaky["rerun_outcomes"]) == (1, ["failed"])
    assert len(flaky["rerun_messages"]) == 1 and "first attempt on rank" in flaky["rerun_messages"][0]
    always = results["test_always_fails"]
    assert outcome_of(always) == ("failed", "assert") and always["rerun_outcomes"] == ["failed"]
    assert outcome_of(results["test_after_reruns"]) == ("passed", None)
    assert outcome_of(results["test_rank_leaves_processes_and_passes"]) == ("passed", None)
    after = results["test_after_leaves_processes"]
    assert outcome_of(after) == ("passed", None), after["message"]
    killer = results["test_rank_kills_its_worker_leaving_a_tokenless_daemon"]
    assert outcome_of(killer) == ("failed", "crash") and "rank 1" in killer["message"], killer["message"]
    daemon = int((tmp_path / "fault" / "daemon.pid").read_text())
    assert not Path(f"/proc/{daemon}").exists(), f"the tokenless daemon {daemon} outlived its rank's worker"
    assert outcome_of(results["test_after_kills_its_worker"]) == ("passed", None)
