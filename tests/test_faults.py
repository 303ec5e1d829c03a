"""The fault-injection suite: tests/faults/cases run through the harness, judged from outside.

Each case's classification is asserted, the case after it must pass, and no process
carrying the run's token (DISTCI_RUN_TOKEN) may remain 15 s after the controller ended,
however it ended (normal end, SIGINT, SIGKILL). The cases are device-agnostic; this
driver runs them on CPU. docs/reliability.md has the command that runs them on any backend.

This file: the pool-mode cases under one controller, their isolation proven able to fail,
torchrun mode against them, and sessions that share a checkout. The other fault-case files
(test_faults_*.py) hold the stops, the state and timeout cases, reruns and polluters.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from conftest import REPO
from distci.run.cellrun import QUIET_PLUGINS
from faultrun import CASES, fault_env, harness_cmd, outcome_of, run_cases

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory):
    """Every pool-mode fault case, one controller, a 12 s default timeout (9 s process group)."""
    proc, results, _ = run_cases(tmp_path_factory.mktemp("faults"), str(CASES / "test_pool_faults.py"),
                                 "--distci-timeout=12")
    return proc, results


@pytest.mark.parametrize("case, outcome, words", [
    # a process group destroyed, an un-waited collective, a FakeTensorMode left on: each ends with
    # the test's forked processes, so the test passes and cannot reach the next one
    ("test_destroys_group", ("passed", None), ""),
    ("test_unwaited_collective", ("passed", None), ""),
    ("test_leaves_fake_mode", ("passed", None), ""),
    ("test_long_marker", ("passed", None), ""),
    ("test_broadcast_spin", ("failed", "timeout"), "still running at the test timeout"),
    ("test_skipped_collective", ("failed", "hang"), "stuck in a collective"),
    ("test_segfault", ("failed", "crash"), "rank 1 killed by SIGSEGV"),
])
def test_fault_is_classified_and_the_next_test_passes(pool_run, case, outcome, words):
    _proc, results = pool_run
    rec = results[case]
    assert outcome_of(rec) == outcome, rec["message"][:2000]
    assert words in rec["message"]
    after = case.replace("test_", "test_after_", 1)
    assert outcome_of(results[after]) == ("passed", None), results[after]["message"][:2000]


def test_hang_is_reported_within_timeout_plus_30s_with_every_ranks_stack(pool_run):
    rec = pool_run[1]["test_skipped_collective"]
    assert rec["duration_s"] <= 6 + 30, rec["duration_s"]
    rank0, rank1 = rec["ranks"]
    assert (rank0["rank"], rank0["outcome"], rank1["rank"], rank1["outcome"]) == (0, "stuck", 1, "passed")
    assert rank0["excerpt"].startswith("rank 0 ") and "torch/distributed/" in rank0["excerpt"]


def test_crash_is_reported_within_2s_with_the_crash_site(pool_run):
    rec = pool_run[1]["test_segfault"]
    assert rec["duration_s"] <= 2.0, rec["duration_s"]
    crashed = rec["ranks"][1]
    assert crashed["rank"] == 1 and crashed["outcome"] == "crash"
    assert "Segmentation fault" in crashed["excerpt"], crashed["excerpt"][-2000:]
    assert "in _crash_here" in crashed["excerpt"] and "in test_segfault" in crashed["excerpt"]


LEAKED = ("default_dtype", "default_device", "num_threads", "deterministic", "grad_mode", "inference_mode",
          "autocast", "matmul_precision", "environ", "cwd", "warnings_filters")


@pytest.fixture(scope="module")
def leaky_run(tmp_path_factory):
    """The same leak cases without isolation: proves each `sees` case can fail."""
    proc, results, _ = run_cases(tmp_path_factory.mktemp("leaky"), str(CASES / "test_pool_faults.py"),
                                 "-k", "test_global", "--distci-no-isolation")
    return proc, results


@pytest.mark.parametrize("name", LEAKED)
def test_isolation_restores(pool_run, leaky_run, name):
    isolated, leaky = pool_run[1], leaky_run[1]
    assert outcome_of(isolated[f"test_global[{name}-leak]"]) == ("passed", None)
    assert outcome_of(isolated[f"test_global[{name}-sees]"]) == ("passed", None), isolated[f"test_global[{name}-sees]"]
    assert outcome_of(leaky[f"test_global[{name}-leak]"]) == ("passed", None), leaky[f"test_global[{name}-leak]"]
    seen = leaky[f"test_global[{name}-sees]"]
    assert outcome_of(seen) == ("failed", "assert") and "leaked from the previous test" in seen["message"], seen


def test_torchrun_mode_agrees_with_the_pool(pool_run, tmp_path):
    """The same skipped-collective bug: `hang` in both modes, each rank's excerpt its own."""
    _proc, results, _ = run_cases(tmp_path, str(CASES / "test_pool_faults.py"), "--distci-timeout=12",
                                  "--distci-mode=torchrun", "-k", "skipped_collective")
    pooled, launched = pool_run[1]["test_skipped_collective"], results["test_skipped_collective"]
    assert outcome_of(launched) == outcome_of(pooled) == ("failed", "hang"), launched["message"]
    assert [r["outcome"] for r in launched["ranks"]] == [r["outcome"] for r in pooled["ranks"]] == ["stuck", "passed"]
    stuck = launched["ranks"][0]
    assert stuck["excerpt"].startswith("rank 0 ") and "torch/distributed/" in stuck["excerpt"], stuck["excerpt"][:3000]
    assert "(rank 1)" not in stuck["excerpt"], "rank 0's excerpt holds rank 1's log"
    assert outcome_of(results["test_after_skipped_collective"]) == ("passed", None)


def test_two_sessions_in_one_checkout_never_read_each_others_rank_logs(tmp_path):
    """No --distci-run-dir: each session's rank logs live in a scratch dir of its own."""
    sessions = []
    for mark in ("MARK-ALPHA", "MARK-BRAVO"):
        cmd = [sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-q",
               f"{CASES / 'test_state_faults.py'}::test_logs_its_mark_and_fails"]
        sessions.append((mark, subprocess.Popen(cmd, cwd=REPO, env=fault_env(uuid.uuid4().hex, DISTCI_FAULT_MARK=mark),
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for mark, proc in sessions:
        out, _ = proc.communicate(timeout=600)
        other = "MARK-BRAVO" if mark == "MARK-ALPHA" else "MARK-ALPHA"
        assert proc.returncode == 1 and f"{mark} fails on rank 0" in out, out[-3000:]
        assert f"{mark} line 39" in out and other not in out, out[-4000:]


def test_a_run_dir_in_use_is_refused_with_a_clear_error(tmp_path):
    import fcntl

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another session holds it
        proc = subprocess.run(harness_cmd(run_dir, str(CASES / "test_pool_faults.py"), "-k", "test_after_segfault"),
                              cwd=REPO, env=fault_env(uuid.uuid4().hex), capture_output=True, text=True, timeout=300)
    finally:
        os.close(fd)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"--distci-run-dir {run_dir} is in use by another pytest session" in proc.stderr + proc.stdout
