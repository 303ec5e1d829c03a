"""The fault cases: tests that change their process or fail oddly (one controller), and timeouts
that know the machine's load (another).
"""

from __future__ import annotations

import pytest

from faultrun import CASES, outcome_of, run_cases

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def state_run(tmp_path_factory):
    """The isolation-by-detection and attribution cases, one controller (12 s default timeout)."""
    proc, results, _ = run_cases(tmp_path_factory.mktemp("state"), str(CASES / "test_state_faults.py"),
                                 "--distci-timeout=12", "-k", "not logs_its_mark")
    return proc, results


CHANGED_PROCESS = [  # each changes its rank process; none of it can reach the next test
    "test_leaves_forward_hook", "test_leaves_function_mode", "test_patches_torch",
    "test_leaves_ddp_state_and_patches_a_collective", "test_leaves_sys_path_and_modules",
    "test_leaves_root_logger_and_anomaly_mode", "test_ignores_sigusr1", "test_leaves_collective_thread",
    "test_leaves_nondaemon_thread",
]
NEXT_PASSING = {"test_ignores_sigusr1": "test_after_hangs_after_sigusr1_ignored"}  # a real hang comes between


@pytest.mark.parametrize("case", CHANGED_PROCESS)
def test_a_test_that_changed_its_process_passes_and_the_next_test_passes(state_run, case):
    assert outcome_of(state_run[1][case]) == ("passed", None), state_run[1][case]["message"][:2000]
    after = NEXT_PASSING.get(case, case.replace("test_", "test_after_", 1))
    assert outcome_of(state_run[1][after]) == ("passed", None), state_run[1][after]["message"][:2000]


def test_a_test_that_ignored_sigusr1_does_not_blind_the_hang_detector(state_run):
    rec = state_run[1]["test_hangs_after_sigusr1_ignored"]
    assert outcome_of(rec) == ("failed", "hang"), rec["message"][:2000]
    stuck = rec["ranks"][0]
    assert stuck["outcome"] == "stuck" and "torch/distributed/" in stuck["excerpt"], stuck["excerpt"][:3000]
    assert outcome_of(state_run[1]["test_after_hangs_after_sigusr1_ignored"]) == ("passed", None)


@pytest.mark.parametrize("case, kind, signature, words", [
    ("test_raises_unprintable", "exception", "test_state_faults.Unprintable:",
     "<Unprintable whose str() raised RuntimeError>"),
    ("test_raises_base_exception[KeyboardInterrupt]", "exception", "KeyboardInterrupt", ""),
    ("test_raises_base_exception[SystemExit]", "exception", "SystemExit", ""),
])
def test_a_failure_is_attributed_to_what_the_test_did(state_run, case, kind, signature, words):
    rec = state_run[1][case]
    assert outcome_of(rec) == ("failed", kind), rec["message"][:2000]
    assert rec["error_signature"].startswith(signature), rec["error_signature"]
    assert words in rec["message"] and "killed by" not in rec["message"], rec["message"][:2000]
    after = "test_after_" + case.split("[")[0].removeprefix("test_")
    assert outcome_of(state_run[1][after]) == ("passed", None), state_run[1][after]["message"][:2000]


def test_a_test_cannot_reach_the_control_channel(state_run):
    """The forked test process closed its worker's channel to the controller before the test
    began: shutting down the socket its number names breaks nothing of the harness's."""
    rec = state_run[1]["test_breaks_control_channel"]
    assert "control channel" not in rec["message"] and rec["failure_kind"] != "crash", rec["message"][:2000]
    assert outcome_of(state_run[1]["test_after_breaks_control_channel"]) == ("passed", None)


@pytest.fixture(scope="module")
def timeout_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timeouts")
    (tmp / "memo").mkdir()
    proc, results, _ = run_cases(tmp, str(CASES / "test_timeouts.py"), "--distci-timeout=12",
                                 DISTCI_FAULT_DIR=str(tmp / "memo"), DISTCI_SATURATED_LOAD_PER_CPU="0")
    return proc, results


def test_a_timeout_on_a_saturated_runner_is_run_again_with_a_longer_budget(timeout_run):
    rec = timeout_run[1]["test_slow_only_the_first_time"]
    assert outcome_of(rec) == ("passed", None), rec["message"][:2000]
    assert rec["rerun_outcomes"] == ["failed"] and "on a saturated runner" in rec["rerun_messages"][0], rec
    load = rec["load"]
    factor = max(3.0, min(40.0, load["load1"] / load["cpus"]))
    assert load["saturated"] and load["progressing"] and load["retried_with_s"] == round(4 * factor, 1), load
    assert {"load1", "load5", "load15", "cpus"} <= load.keys(), load


def test_a_rank_stuck_in_a_collective_is_a_hang_however_loaded_the_runner(timeout_run):
    rec = timeout_run[1]["test_stuck_in_a_collective"]
    assert outcome_of(rec) == ("failed", "hang") and rec["reruns"] == 0, rec
    assert rec["load"]["saturated"] and not rec["load"]["progressing"], rec["load"]
    assert rec["duration_s"] < 4 + 15, rec["duration_s"]


def test_a_pytest_timeout_marker_is_distcis_per_test_timeout(timeout_run):
    proc, results = timeout_run
    rec = results["test_pytest_timeout_marker"]
    assert outcome_of(rec) == ("failed", "timeout") and rec["duration_s"] < 3 + 15, rec
    assert outcome_of(results["test_after_timeouts"]) == ("passed", None), results["test_after_timeouts"]["message"]
    assert "INTERNALERROR" not in proc.stdout + proc.stderr
