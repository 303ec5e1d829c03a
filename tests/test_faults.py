"""The fault-injection suite: tests/faults/cases run through the harness, judged from outside.

Each case's classification is asserted, the case after it must pass, and no process
carrying the run's token (DISTCI_RUN_TOKEN) may remain 15 s after the controller ended,
however it ended (normal end, SIGINT, SIGKILL). The cases are device-agnostic; this
driver runs them on CPU. docs/reliability.md has the command that runs them on any backend.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO
from distci.harness import procs

pytestmark = pytest.mark.slow

CASES = Path(__file__).parent / "faults" / "cases"
LEFTOVER_LIMIT_S = 15.0


def _env(token: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env[procs.RUN_TOKEN_ENV] = token
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def _cmd(run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", "-p", "no:cacheprovider", "-q",
            f"--distci-run-dir={run_dir}", "--distci-cell=cpu-faults-ws2", *args]


def _leftovers_after(token: str, limit_s: float = LEFTOVER_LIMIT_S, exclude: set[int] = frozenset()
                     ) -> tuple[list[int], float]:  # type: ignore[assignment]
    """Waits up to `limit_s` for every token-carrying process to go; (what is left, seconds waited)."""
    start = time.monotonic()
    spared = {os.getpid(), *exclude}
    left = procs.with_token(token, spared, prefix=True)
    while left and time.monotonic() - start < limit_s:
        time.sleep(0.1)
        left = procs.with_token(token, spared, prefix=True)
    return left, time.monotonic() - start


def _results(run_dir: Path) -> dict[str, dict]:
    out = {}
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["test_id"].split("::", 1)[1]] = rec
    return out


def _run(tmp_path: Path, *args: str, timeout: float = 600, **env: str
         ) -> tuple[subprocess.CompletedProcess, dict, str]:
    token = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    proc = subprocess.run(_cmd(run_dir, *args), cwd=REPO, env=_env(token, **env), capture_output=True, text=True,
                          timeout=timeout)
    left, _ = _leftovers_after(token)
    assert left == [], f"processes of the run still alive {LEFTOVER_LIMIT_S:.0f} s after it ended: {left}"
    return proc, _results(run_dir), token


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory):
    """Every pool-mode fault case, one controller, a 12 s default timeout (9 s process group)."""
    proc, results, _ = _run(tmp_path_factory.mktemp("faults"), str(CASES / "test_pool_faults.py"),
                            "--distci-timeout=12")
    return proc, results


def _outcome(rec: dict) -> tuple[str, str | None]:
    return rec["outcome"], rec["failure_kind"]


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
    assert _outcome(rec) == outcome, rec["message"][:2000]
    assert words in rec["message"]
    after = case.replace("test_", "test_after_", 1)
    assert _outcome(results[after]) == ("passed", None), results[after]["message"][:2000]


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
    proc, results, _ = _run(tmp_path_factory.mktemp("leaky"), str(CASES / "test_pool_faults.py"),
                            "-k", "test_global", "--distci-no-isolation")
    return proc, results


@pytest.mark.parametrize("name", LEAKED)
def test_isolation_restores(pool_run, leaky_run, name):
    isolated, leaky = pool_run[1], leaky_run[1]
    assert _outcome(isolated[f"test_global[{name}-leak]"]) == ("passed", None)
    assert _outcome(isolated[f"test_global[{name}-sees]"]) == ("passed", None), isolated[f"test_global[{name}-sees]"]
    assert _outcome(leaky[f"test_global[{name}-leak]"]) == ("passed", None), leaky[f"test_global[{name}-leak]"]
    seen = leaky[f"test_global[{name}-sees]"]
    assert _outcome(seen) == ("failed", "assert") and "leaked from the previous test" in seen["message"], seen


def test_torchrun_mode_agrees_with_the_pool(pool_run, tmp_path):
    """The same skipped-collective bug: `hang` in both modes, each rank's excerpt its own."""
    _proc, results, _ = _run(tmp_path, str(CASES / "test_pool_faults.py"), "--distci-timeout=12",
                             "--distci-mode=torchrun", "-k", "skipped_collective")
    pooled, launched = pool_run[1]["test_skipped_collective"], results["test_skipped_collective"]
    assert _outcome(launched) == _outcome(pooled) == ("failed", "hang"), launched["message"]
    assert [r["outcome"] for r in launched["ranks"]] == [r["outcome"] for r in pooled["ranks"]] == ["stuck", "passed"]
    stuck = launched["ranks"][0]
    assert stuck["excerpt"].startswith("rank 0 ") and "torch/distributed/" in stuck["excerpt"], stuck["excerpt"][:3000]
    assert "(rank 1)" not in stuck["excerpt"], "rank 0's excerpt holds rank 1's log"
    assert _outcome(results["test_after_skipped_collective"]) == ("passed", None)


def test_a_failure_a_known_issue_explains_is_not_run_again(tmp_path):
    """--distci-reruns reruns an unknown failure only: the one the registry explains is
    recorded as known after one attempt, while the unknown one in the same run is rerun."""
    registry = tmp_path / "known_issues.toml"
    registry.write_text(
        '[[issue]]\nid = "case-always-fails"\ntitle = "the always-failing fault case"\n'
        'tests = ["*test_reruns.py::test_always_fails"]\nsignature = "fails every time"\nupstream = ""\n')
    _proc, results, _ = _run(tmp_path, str(CASES / "test_reruns.py"), "-k", "always_fails or first_time",
                             "--distci-reruns=1", f"--distci-known-issues={registry}")
    known = results["test_always_fails"]
    assert (known["outcome"], known["known_issue"], known["reruns"]) == ("failed", "case-always-fails", 0), known
    flaky = results["test_fails_first_time"]
    assert (flaky["outcome"], flaky["reruns"]) == ("passed", 1), flaky


def test_reruns_and_processes_left_by_a_passing_test(tmp_path):
    (tmp_path / "fault").mkdir()
    _proc, results, _ = _run(tmp_path, str(CASES / "test_reruns.py"), str(CASES / "test_leave_processes.py"),
                             "-k", "not pool_rank and not torchrun_rank", "--distci-reruns=1",
                             DISTCI_FAULT_DIR=str(tmp_path / "fault"))
    flaky = results["test_fails_first_time"]
    assert _outcome(flaky) == ("passed", None)
    assert (flaky["reruns"], flaky["rerun_outcomes"]) == (1, ["failed"])
    assert len(flaky["rerun_messages"]) == 1 and "first attempt on rank" in flaky["rerun_messages"][0]
    always = results["test_always_fails"]
    assert _outcome(always) == ("failed", "assert") and always["rerun_outcomes"] == ["failed"]
    assert _outcome(results["test_after_reruns"]) == ("passed", None)
    assert _outcome(results["test_rank_leaves_processes_and_passes"]) == ("passed", None)
    after = results["test_after_leaves_processes"]
    assert _outcome(after) == ("passed", None), after["message"]
    killer = results["test_rank_kills_its_worker_leaving_a_tokenless_daemon"]
    assert _outcome(killer) == ("failed", "crash") and "rank 1" in killer["message"], killer["message"]
    daemon = int((tmp_path / "fault" / "daemon.pid").read_text())
    assert not Path(f"/proc/{daemon}").exists(), f"the tokenless daemon {daemon} outlived its rank's worker"
    assert _outcome(results["test_after_kills_its_worker"]) == ("passed", None)


def _start_and_wait_ready(tmp_path: Path, target: str, token: str) -> tuple[subprocess.Popen, Path]:
    ready, run_dir = tmp_path / "ready", tmp_path / "run"
    ready.mkdir()
    proc = subprocess.Popen(_cmd(run_dir, f"{CASES / 'test_leave_processes.py'}::{target}"), cwd=REPO,
                            env=_env(token, DISTCI_FAULT_DIR=str(ready)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(ready.glob("ready-rank*"))) < 2:
        assert proc.poll() is None, proc.stdout.read()[-3000:]  # type: ignore[union-attr]
        time.sleep(0.3)
    assert len(list(ready.glob("ready-rank*"))) == 2, "the ranks never got ready"
    return proc, run_dir


@pytest.mark.parametrize("target", ["test_pool_rank_leaves_processes", "test_torchrun_rank_leaves_processes"])
def test_sigkill_of_the_controller_leaves_nothing(tmp_path, target):
    """Ranks (and torchrun's agent) die by their parent-death signal; a rank's child and its
    setsid grandchild are found by the run token and killed by the reaper."""
    token = uuid.uuid4().hex
    proc, _ = _start_and_wait_ready(tmp_path, target, token)
    ours = procs.with_token(token, {os.getpid(), proc.pid}, prefix=True)
    assert len(ours) >= 6, f"expected 2 ranks, 2 children, 2 grandchildren; found {ours}"
    proc.kill()
    proc.wait()
    left, waited = _leftovers_after(token)
    assert left == [], f"alive {LEFTOVER_LIMIT_S:.0f} s after SIGKILL of the controller: {left}"
    print(f"cleanup after SIGKILL ({target}): {waited:.1f} s")


@pytest.mark.parametrize("sig", [signal.SIGTERM])  # SIGINT: the cell-run case below sends it
def test_a_stopped_controller_records_and_cleans_up_within_10s(tmp_path, sig):
    token = uuid.uuid4().hex
    proc, run_dir = _start_and_wait_ready(tmp_path, "test_pool_rank_leaves_processes", token)
    stopped = time.monotonic()
    proc.send_signal(sig)
    owned, cleanup = _leftovers_after(token, exclude={proc.pid})  # everything the controller started
    out, _ = proc.communicate(timeout=60)
    left, _ = _leftovers_after(token)
    assert owned == [] and left == [] and proc.returncode == 2, out[-3000:]
    assert cleanup <= 10.0, cleanup
    rec = _results(run_dir)["test_pool_rank_leaves_processes"]
    assert _outcome(rec) == ("error", "infra") and rec["error_signature"] == f"Interrupted: stopped by {sig.name}"
    cases = ET.parse(run_dir / "junit.xml").getroot().findall(".//testcase")
    assert len(cases) == 1 and "test_pool_rank_leaves_processes" in cases[0].get("name", "")
    print(f"cleanup after {sig.name}: {cleanup:.1f} s (the controller's own exit: {time.monotonic() - stopped:.1f} s)")


CELL_RUN = """
import sys
from pathlib import Path
from distci.run.cellrun import run_in_env, start_run
from distci.matrix import load_matrix

cell = next(c for c in load_matrix(Path("matrix.toml")).cells if c.accelerator == "cpu")
info, run_dir = start_run(cell, Path(sys.argv[1]), tier="pr")
try:
    run_in_env(cell, Path(sys.executable), info, run_dir, tier="pr", tests=[sys.argv[2]])
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_sigint_to_the_cell_run_closes_the_run_and_prints_its_summary(tmp_path, inherited):
    """`python -m distci run` stopped by Ctrl-C: the test in flight recorded, run.json
    closed with ended_at, the summary table printed, nothing left running. Also when the
    controller was started with SIGINT ignored (a background job of a non-interactive
    shell, as CI wrappers launch it): a cancel's SIGINT must still stop the run."""
    token = uuid.uuid4().hex
    ready, runs = tmp_path / "ready", tmp_path / "runs"
    ready.mkdir()
    target = f"{CASES / 'test_leave_processes.py'}::test_pool_rank_leaves_processes"
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if inherited == "ignored" else None
    proc = subprocess.Popen([sys.executable, "-c", CELL_RUN, str(runs), target], cwd=REPO,
                            env=_env(token, DISTCI_FAULT_DIR=str(ready)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=ignore)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(ready.glob("ready-rank*"))) < 2 and proc.poll() is None:
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:  # a controller that ignored the signal must not outlive the test
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out[-3000:]
    assert "distci results" in out, out[-3000:]
    (run_dir,) = runs.iterdir()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["ended_at"] and info["pytest_exit"] == 2, info
    rec = _results(run_dir)["test_pool_rank_leaves_processes"]
    assert rec["error_signature"] == "Interrupted: stopped by SIGINT", rec
    left, _ = _leftovers_after(token)
    assert left == [], left


@pytest.fixture(scope="module")
def state_run(tmp_path_factory):
    """The isolation-by-detection and attribution cases, one controller (12 s default timeout)."""
    proc, results, _ = _run(tmp_path_factory.mktemp("state"), str(CASES / "test_state_faults.py"),
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
    assert _outcome(state_run[1][case]) == ("passed", None), state_run[1][case]["message"][:2000]
    after = NEXT_PASSING.get(case, case.replace("test_", "test_after_", 1))
    assert _outcome(state_run[1][after]) == ("passed", None), state_run[1][after]["message"][:2000]


def test_a_test_that_ignored_sigusr1_does_not_blind_the_hang_detector(state_run):
    rec = state_run[1]["test_hangs_after_sigusr1_ignored"]
    assert _outcome(rec) == ("failed", "hang"), rec["message"][:2000]
    stuck = rec["ranks"][0]
    assert stuck["outcome"] == "stuck" and "torch/distributed/" in stuck["excerpt"], stuck["excerpt"][:3000]
    assert _outcome(state_run[1]["test_after_hangs_after_sigusr1_ignored"]) == ("passed", None)


@pytest.mark.parametrize("case, kind, signature, words", [
    ("test_raises_unprintable", "exception", "test_state_faults.Unprintable:",
     "<Unprintable whose str() raised RuntimeError>"),
    ("test_raises_base_exception[KeyboardInterrupt]", "exception", "KeyboardInterrupt", ""),
    ("test_raises_base_exception[SystemExit]", "exception", "SystemExit", ""),
])
def test_a_failure_is_attributed_to_what_the_test_did(state_run, case, kind, signature, words):
    rec = state_run[1][case]
    assert _outcome(rec) == ("failed", kind), rec["message"][:2000]
    assert rec["error_signature"].startswith(signature), rec["error_signature"]
    assert words in rec["message"] and "killed by" not in rec["message"], rec["message"][:2000]
    after = "test_after_" + case.split("[")[0].removeprefix("test_")
    assert _outcome(state_run[1][after]) == ("passed", None), state_run[1][after]["message"][:2000]


def test_a_test_cannot_reach_the_control_channel(state_run):
    """The forked test process closed its worker's channel to the controller before the test
    began: shutting down the socket its number names breaks nothing of the harness's."""
    rec = state_run[1]["test_breaks_control_channel"]
    assert "control channel" not in rec["message"] and rec["failure_kind"] != "crash", rec["message"][:2000]
    assert _outcome(state_run[1]["test_after_breaks_control_channel"]) == ("passed", None)


SITECUSTOMIZE = """import os
if os.environ.get("RANK") is not None:  # a rank worker (the controller has no RANK): it never starts
    os._exit(3)
"""


def test_the_pool_stops_restarting_after_n_failed_starts(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    token = uuid.uuid4().hex
    env = _env(token)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), env["PYTHONPATH"]])
    run_dir = tmp_path / "run"
    proc = subprocess.run(_cmd(run_dir, str(CASES / "test_pool_faults.py"), "-k", "test_after",
                               "--distci-max-pool-starts=2"), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:]
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(records) >= 4 and all(_outcome(r) == ("error", "infra") for r in records), records
    assert [r["error_signature"].split(":")[0] for r in records[:2]] == ["PoolStartError"] * 2
    for rec in records[2:]:
        assert rec["error_signature"] == "PoolStartsExhausted: 2-rank pool", rec
        assert "failed to start 2 times in a row (--distci-max-pool-starts=2)" in rec["message"], rec["message"]
        assert "during start-up (it exited with code 3)" in rec["message"], rec["message"]
        assert rec["duration_s"] < 1.0
    assert _leftovers_after(token)[0] == []


def test_two_sessions_in_one_checkout_never_read_each_others_rank_logs(tmp_path):
    """No --distci-run-dir: each session's rank logs live in a scratch dir of its own."""
    sessions = []
    for mark in ("MARK-ALPHA", "MARK-BRAVO"):
        cmd = [sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", "-p", "no:cacheprovider", "-q",
               f"{CASES / 'test_state_faults.py'}::test_logs_its_mark_and_fails"]
        sessions.append((mark, subprocess.Popen(cmd, cwd=REPO, env=_env(uuid.uuid4().hex, DISTCI_FAULT_MARK=mark),
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
        proc = subprocess.run(_cmd(run_dir, str(CASES / "test_pool_faults.py"), "-k", "test_after_segfault"),
                              cwd=REPO, env=_env(uuid.uuid4().hex), capture_output=True, text=True, timeout=300)
    finally:
        os.close(fd)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"--distci-run-dir {run_dir} is in use by another pytest session" in proc.stderr + proc.stdout


POLLUTERS = CASES / "test_polluters.py"


def _polluter_kinds() -> list[str]:
    import ast

    tree = ast.parse(POLLUTERS.read_text())
    kinds = next(n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "KINDS")
    return [k.value for k in kinds.keys]


def _polluter_run(tmp_path: Path, *args: str) -> tuple[dict, dict[int, str]]:
    (tmp_path / "memo").mkdir()
    _proc, results, _ = _run(tmp_path, str(POLLUTERS), "--distci-timeout=30", *args, timeout=1800,
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
    assert _outcome(results[f"test_kind[{kind}-pollute]"]) == ("passed", None)
    check = results[f"test_kind[{kind}-check]"]
    assert _outcome(check) == ("passed", None), check["message"][:2000]
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
    assert _outcome(hang) == ("failed", "hang"), hang["message"][:2000]
    stuck = hang["ranks"][0]
    assert "torch/distributed/" in stuck["excerpt"] and "in test_witness_hang" in stuck["excerpt"], stuck["excerpt"][:3000]
    crash = results["test_witness_crash"]
    assert _outcome(crash) == ("failed", "crash") and "rank 1 killed by SIGSEGV" in crash["message"], crash["message"]
    crashed = crash["ranks"][1]["excerpt"]
    assert "Segmentation fault" in crashed and "in test_witness_crash" in crashed, crashed[-2000:]


@pytest.fixture(scope="module")
def timeout_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timeouts")
    (tmp / "memo").mkdir()
    proc, results, _ = _run(tmp, str(CASES / "test_timeouts.py"), "--distci-timeout=12",
                            DISTCI_FAULT_DIR=str(tmp / "memo"), DISTCI_SATURATED_LOAD_PER_CPU="0")
    return proc, results


def test_a_timeout_on_a_saturated_runner_is_run_again_with_a_longer_budget(timeout_run):
    rec = timeout_run[1]["test_slow_only_the_first_time"]
    assert _outcome(rec) == ("passed", None), rec["message"][:2000]
    assert rec["rerun_outcomes"] == ["failed"] and "on a saturated runner" in rec["rerun_messages"][0], rec
    load = rec["load"]
    factor = max(3.0, min(40.0, load["load1"] / load["cpus"]))
    assert load["saturated"] and load["progressing"] and load["retried_with_s"] == round(4 * factor, 1), load
    assert {"load1", "load5", "load15", "cpus"} <= load.keys(), load


def test_a_rank_stuck_in_a_collective_is_a_hang_however_loaded_the_runner(timeout_run):
    rec = timeout_run[1]["test_stuck_in_a_collective"]
    assert _outcome(rec) == ("failed", "hang") and rec["reruns"] == 0, rec
    assert rec["load"]["saturated"] and not rec["load"]["progressing"], rec["load"]
    assert rec["duration_s"] < 4 + 15, rec["duration_s"]


def test_a_pytest_timeout_marker_is_distcis_per_test_timeout(timeout_run):
    proc, results = timeout_run
    rec = results["test_pytest_timeout_marker"]
    assert _outcome(rec) == ("failed", "timeout") and rec["duration_s"] < 3 + 15, rec
    assert _outcome(results["test_after_timeouts"]) == ("passed", None), results["test_after_timeouts"]["message"]
    assert "INTERNALERROR" not in proc.stdout + proc.stderr
