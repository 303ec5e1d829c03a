"""The harness for real: rank workers spawned, hangs, crashes, timeouts, recovery, isolation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import CASES, REPO, processes_with_env, run_pytest
from distci.run.cellrun import QUIET_PLUGINS
from faultrun import read_results

pytestmark = pytest.mark.slow


# One session serves the tests that read a plain run's records: the fault classes of
# test_basic.py, a test that owns its process group (torchrun mode) and the nine compile
# scenarios under isolation (each file its own session was a pytest controller and a rank
# pool more apiece; the others start sessions with options of their own).
OWN_GROUP = "test_torchrun_mode.py::test_own_group"
COMPILES = {f"test_compiles[{n}]": ("passed", None) for n in range(1, 10)}


@pytest.fixture(scope="module")
def basic_run(tmp_path_factory):
    import uuid

    token = uuid.uuid4().hex
    run_dir = tmp_path_factory.mktemp("run")
    start = time.monotonic()
    proc = run_pytest(
        [str(CASES / "test_basic.py"), str(CASES / OWN_GROUP), str(CASES / "test_recompile.py"),
         "--distci-run-dir", str(run_dir), "--distci-cell", "cpu-test-ws2-fix_on"],
        env={"DISTCI_TEST_TOKEN": token},
    )
    return {"proc": proc, "dir": run_dir, "results": read_results(run_dir), "token": token,
            "wall": time.monotonic() - start}


def test_outcomes_are_classified(basic_run):
    r = basic_run["results"]
    assert basic_run["proc"].returncode == 1, basic_run["proc"].stdout[-3000:]
    expected = {
        "test_allreduce": ("passed", None),
        "test_rank_assert": ("failed", "assert"),
        "test_after_assert": ("passed", None),
        "test_hang": ("failed", "hang"),
        "test_after_hang": ("passed", None),
        "test_crash": ("failed", "crash"),
        "test_after_crash": ("passed", None),
        "test_segfault": ("failed", "crash"),
        "test_after_segfault": ("passed", None),
        "test_slow": ("failed", "timeout"),
        "test_after_slow": ("passed", None),
        "test_param[1]": ("passed", None),
        "test_param[3]": ("passed", None),
        "test_skip": ("skipped", None),
        "test_three_ranks": ("passed", None),
        "test_plain_in_controller": ("passed", None),
        "test_own_group": ("passed", None),
        **COMPILES,
    }
    got = {name: (rec["outcome"], rec["failure_kind"]) for name, rec in r.items()}
    assert got == expected


def test_hang_has_both_ranks_stacks_in_time(basic_run):
    rec = basic_run["results"]["test_hang"]
    assert rec["duration_s"] <= 8 + 30
    assert [x["rank"] for x in rec["ranks"]] == [0, 1]
    rank0, rank1 = (x["excerpt"] for x in rec["ranks"])
    assert "all_reduce" in rank0 and "test_hang" in rank0
    assert "time.sleep" in rank1 or "test_hang" in rank1
    for excerpt in (rank0, rank1):
        assert "Current thread" in excerpt or "Thread 0x" in excerpt or "py-spy" in excerpt


def test_crash_names_the_dead_rank(basic_run):
    r = basic_run["results"]
    assert "rank 1 exited with code 13" in r["test_crash"]["message"]
    assert "SIGSEGV" in r["test_segfault"]["message"]
    assert r["test_crash"]["error_signature"] == "RankCrash: rank N exited with code N"


def test_records_carry_cell_stack_and_repro(basic_run):
    for rec in basic_run["results"].values():
        assert rec["cell_id"] == "cpu-test-ws2-fix_on"
        assert len(rec["stack"]["torch_git"]) == 40
        assert rec["repro"].startswith("nox -s dist_tests -- --cell cpu-test-ws2-fix_on --test ")
    junit = ET.parse(basic_run["dir"] / "junit.xml").getroot()
    cases = junit.findall(".//testcase")
    assert len(cases) == len(basic_run["results"])
    for case in cases:
        props = {p.get("name"): p.get("value") for p in case.findall("properties/property")}
        assert props["cell_id"] == "cpu-test-ws2-fix_on"
        assert len(props["stack.torch_git"]) == 40


def test_no_worker_outlives_the_session(basic_run):
    time.sleep(1)
    assert processes_with_env(basic_run["token"]) == []


def test_ninth_compile_scenario_still_compiles(basic_run):
    """With isolation, all nine compile (basic_run's session, after its faults); without it,
    the ninth silently runs eagerly."""
    got = {name: (rec["outcome"], rec["failure_kind"]) for name, rec in basic_run["results"].items()}
    assert {name: got.get(name) for name in COMPILES} == COMPILES
    leaky = run_pytest([str(CASES / "test_recompile.py"), "--distci-no-isolation"])
    assert leaky.returncode == 1
    assert "test_compiles[9]" in leaky.stdout and "fell back to eager" in leaky.stdout
    assert "8 passed" in leaky.stdout


def test_torchrun_mode_for_tests_that_own_their_group(basic_run):
    """torchrun mode in a session whose other tests run in the rank pool (basic_run's)."""
    rec = basic_run["results"]["test_own_group"]
    assert rec["outcome"] == "passed", rec.get("message")


def test_timeout_cap_bounds_a_markers_timeout(tmp_path):
    """`--distci-timeout-cap` wins over a larger dist_timeout marker (GPU runners use it)."""
    start = time.monotonic()
    proc = run_pytest([str(CASES / "test_torchrun_mode.py"), "--distci-run-dir", str(tmp_path),
                       "-k", "capped", "--distci-timeout-cap=6"], timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:]
    rec = read_results(tmp_path)["test_marker_timeout_is_capped"]
    assert (rec["outcome"], rec["failure_kind"]) == ("failed", "timeout"), rec
    assert time.monotonic() - start < 120


def test_idle_pools_beyond_the_cap_are_shut_down(tmp_path):
    """One pool per world size serves every timeout class (each test's fork joins a group with
    its class's timeout); the selection's pools start ahead where they fit, those of tests that
    will skip never, and no more rank workers than --distci-max-live-ranks are up at once: idle
    pools go, least recently used first, and come back when a test needs them (all up at once
    was ~12 GB a session with a CUDA build of torch). Each case counts this session's live
    workers and reads its group's timeout; the 2-rank pool started twice (at the start, and
    after the 4-rank pool), the 1-rank pool of the two skipped tests never."""
    import uuid

    token = uuid.uuid4().hex
    proc = run_pytest([str(CASES / "test_pool_classes.py"), "--distci-run-dir", str(tmp_path)],
                      env={"DISTCI_TEST_TOKEN": token, "DISTCI_MAX_LIVE_RANKS": "5"}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert {k: r["outcome"] for k, r in read_results(tmp_path).items()} == {
        **{name: "passed" for name in ("test_default_class", "test_long_class", "test_longer_class",
                                       "test_three_ranks", "test_four_ranks", "test_default_class_again")},
        "test_skipped_one_rank": "skipped", "test_one_rank_on_another_accelerator": "skipped"}
    logs = tmp_path / "logs"
    starts = {ws: (logs / f"ws{ws}-rank0.log").read_text().count("===== distci pool generation")
              for ws in (2, 3, 4)}
    assert starts == {2: 2, 3: 1, 4: 1}, starts
    assert not (logs / "ws1-rank0.log").exists()
    time.sleep(1)
    assert processes_with_env(token) == []


def test_collect_only_starts_no_rank_worker(tmp_path):
    """--collect-only lists the selection and starts no pool, neither the default one nor the
    ones the selection would launch ahead (their ranks would import torch for nothing)."""
    import uuid

    token = uuid.uuid4().hex
    proc = run_pytest([str(CASES / "test_pool_classes.py"), "--collect-only", "--distci-run-dir", str(tmp_path)],
                      env={"DISTCI_TEST_TOKEN": token, "DISTCI_MAX_LIVE_RANKS": "5"}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "test_three_ranks" in proc.stdout
    assert sorted(p.name for p in tmp_path.glob("logs/ws*-rank*.log")) == []
    assert processes_with_env(token) == []


@pytest.mark.parametrize("where", ["torchrun"])  # pool mode: test_faults_stops.py's SIGTERM case
def test_a_stopped_run_records_where_it_stopped(tmp_path, token, where):
    """SIGTERM (a CI job timeout) mid-test: finished results stay, the test in flight is
    an `Interrupted` infra Result, JUnit is written and no rank outlives the run."""
    run_dir = tmp_path / "run"
    target = "test_sleeps_in_the_pool" if where == "pool" else "test_sleeps_under_torchrun"
    env = dict(os.environ, DISTCI_TEST_TOKEN=token,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-q",
         str(CASES / "test_stoppable.py"), "-k", f"finishes or {target}", "--distci-run-dir", str(run_dir),
         "--distci-cell", "cpu-test-ws2-fix_on"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(processes_with_env(token)) < 3:  # pytest + 2 sleeping ranks
        time.sleep(0.5)
    while time.monotonic() < deadline and "test_finishes" not in _read(run_dir / "results.jsonl"):
        time.sleep(0.5)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-3000:]  # pytest's "interrupted"
    results = read_results(run_dir)
    assert results["test_finishes"]["outcome"] == "passed"
    stopped = results[target]
    assert (stopped["outcome"], stopped["failure_kind"]) == ("error", "infra"), stopped
    assert stopped["error_signature"] == "Interrupted: stopped by SIGTERM"
    assert target in (run_dir / "junit.xml").read_text()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and processes_with_env(token):
        time.sleep(0.5)
    assert processes_with_env(token) == []


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
