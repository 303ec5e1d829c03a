"""The fault cases: a controller stopped (SIGKILL, SIGTERM, SIGINT to a cell run) leaves nothing
running and records what was in flight; a pool that cannot start stops restarting.
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
from faultrun import CASES, LEFTOVER_LIMIT_S, fault_env, harness_cmd, leftovers_after, outcome_of, read_results

pytestmark = pytest.mark.slow


def _start_and_wait_ready(tmp_path: Path, target: str, token: str) -> tuple[subprocess.Popen, Path]:
    ready, run_dir = tmp_path / "ready", tmp_path / "run"
    ready.mkdir()
    proc = subprocess.Popen(harness_cmd(run_dir, f"{CASES / 'test_leave_processes.py'}::{target}"), cwd=REPO,
                            env=fault_env(token, DISTCI_FAULT_DIR=str(ready)), stdout=subprocess.PIPE,
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
    left, waited = leftovers_after(token)
    assert left == [], f"alive {LEFTOVER_LIMIT_S:.0f} s after SIGKILL of the controller: {left}"
    print(f"cleanup after SIGKILL ({target}): {waited:.1f} s")


@pytest.mark.parametrize("sig", [signal.SIGTERM])  # SIGINT: the cell-run case below sends it
def test_a_stopped_controller_records_and_cleans_up_within_10s(tmp_path, sig):
    token = uuid.uuid4().hex
    proc, run_dir = _start_and_wait_ready(tmp_path, "test_pool_rank_leaves_processes", token)
    stopped = time.monotonic()
    proc.send_signal(sig)
    owned, cleanup = leftovers_after(token, exclude={proc.pid})  # everything the controller started
    out, _ = proc.communicate(timeout=60)
    left, _ = leftovers_after(token)
    assert owned == [] and left == [] and proc.returncode == 2, out[-3000:]
    assert cleanup <= 10.0, cleanup
    rec = read_results(run_dir)["test_pool_rank_leaves_processes"]
    assert outcome_of(rec) == ("error", "infra") and rec["error_signature"] == f"Interrupted: stopped by {sig.name}"
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
                            env=fault_env(token, DISTCI_FAULT_DIR=str(ready)), stdout=subprocess.PIPE,
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
    rec = read_results(run_dir)["test_pool_rank_leaves_processes"]
    assert rec["error_signature"] == "Interrupted: stopped by SIGINT", rec
    left, _ = leftovers_after(token)
    assert left == [], left


SITECUSTOMIZE = """import os
# the pool's zygote (or a rank worker spawned afresh: the controller has no RANK) never starts
if b"distci.harness.zygote" in open("/proc/self/cmdline", "rb").read() or os.environ.get("RANK") is not None:
    os._exit(3)
"""


def test_the_pool_stops_restarting_after_n_failed_starts(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    token = uuid.uuid4().hex
    env = fault_env(token)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), env["PYTHONPATH"]])
    run_dir = tmp_path / "run"
    proc = subprocess.run(harness_cmd(run_dir, str(CASES / "test_pool_faults.py"), "-k", "test_after",
                                      "--distci-max-pool-starts=2"), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:]
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(records) >= 4 and all(outcome_of(r) == ("error", "infra") for r in records), records
    assert [r["error_signature"].split(":")[0] for r in records[:2]] == ["PoolStartError"] * 2
    for rec in records[2:]:
        assert rec["error_signature"] == "PoolStartsExhausted: 2-rank pool", rec
        assert "failed to start 2 times in a row (--distci-max-pool-starts=2)" in rec["message"], rec["message"]
        assert "during start-up (it exited with code 3)" in rec["message"], rec["message"]
        assert rec["duration_s"] < 1.0
    assert leftovers_after(token)[0] == []
