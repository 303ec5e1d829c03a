"""The README's commands through nox, as a person and a CI job run them.

Ctrl-C typed into a real terminal (a pty: the line discipline sends SIGINT to the whole
foreground process group, nox and the controller alike) and a CI cancel (SIGTERM to nox
alone) during `nox -s dist_tests` must close the run as `python -m distci run` does:
the test in flight recorded, the summary printed, junit.xml holding the same tests as
results.jsonl, run.json ended, `.nox/distci-exit.json` written, nothing left running.
`DISTCI_FIXES=none` runs the cell with no fix applied, under the fix_off id; an id list is
refused. The cell runs on this interpreter's installed stack (`--python`): no download.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO
from distci.harness import procs

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("nox") is None, reason="needs nox on PATH (pip install nox)")]

CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
CASES = Path(__file__).parent / "faults" / "cases"
EXIT_FILE = REPO / ".nox" / "distci-exit.json"
SETUP_S = 900  # a first run creates the controller venv and the installed-stack overlay


def _nox_args(runs: Path, test: str) -> list[str]:
    return [shutil.which("nox") or "nox", "-s", "dist_tests", "--", "--cell", CELL, "--python", sys.executable,
            "--test", test, "--runs-root", str(runs)]


def _env(token: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DISTCI_FIXES")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(Path(sys.executable).parent)))
    return dict(env, **{procs.RUN_TOKEN_ENV: token}, **extra)


def _wait_ready(ready: Path, alive, deadline_s: float = SETUP_S) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and len(list(ready.glob("ready-rank*"))) < 2:
        assert alive(), "nox ended before the ranks got ready"
        time.sleep(0.5)
    assert len(list(ready.glob("ready-rank*"))) == 2, "the ranks never got ready"


def _closed_run(runs: Path, out: str, stopped_by: str, exit_text: str | None = None) -> None:
    """The stopped run closed; `exit_text`: the exit file as read right after the run (a
    module fixture's run, read later, when another nox session may have rewritten it)."""
    assert "distci results" in out, out[-4000:]
    (run_dir,) = runs.iterdir()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["ended_at"] and info["exit_code"] == 130, info  # a stopped run's exit code, never null
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r["error_signature"] for r in results] == [f"Interrupted: stopped by {stopped_by}"], results
    cases = ET.parse(run_dir / "junit.xml").getroot().findall(".//testcase")
    assert len(cases) == len(results) and results[0]["test_id"].endswith(cases[0].get("name", "")), cases
    exit_info = json.loads(EXIT_FILE.read_text() if exit_text is None else exit_text)
    assert exit_info.get("exit_code") == 130 and exit_info.get("meaning") == "interrupted", exit_info


def _read_all(fd: int, into: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        into.append(chunk)


def test_ctrl_c_in_a_terminal_closes_the_run(tmp_path):
    token, ready, runs = uuid.uuid4().hex, tmp_path / "ready", tmp_path / "runs"
    ready.mkdir()
    args = _nox_args(runs, f"{CASES / 'test_leave_processes.py'}::test_pool_rank_leaves_processes")
    env = _env(token, DISTCI_FAULT_DIR=str(ready))
    pid, master = pty.fork()
    if pid == 0:  # the child: session leader of the pty, nox in its foreground group
        os.chdir(REPO)
        os.execve(args[0], args, env)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(master, chunks), daemon=True)
    reader.start()
    try:
        _wait_ready(ready, lambda: os.waitpid(pid, os.WNOHANG) == (0, 0))
        os.write(master, b"\x03")  # Ctrl-C, as typed
        deadline, status = time.monotonic() + 240, None
        while time.monotonic() < deadline and status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            status = raw if done else None
            time.sleep(0.2)
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    reader.join(10)
    os.close(master)
    out = b"".join(chunks).decode("utf-8", "replace")
    assert status is not None, out[-4000:]
    _closed_run(runs, out, "SIGINT")
    left = procs.with_token(token, {os.getpid()}, prefix=True)
    assert left == [], left


@pytest.fixture(scope="module")
def cancelled_run(tmp_path_factory) -> dict:
    """`nox -s dist_tests` under `DISTCI_FIXES=none`, stopped by a CI cancel (SIGTERM to nox
    alone) once its ranks are in the test: the run the cancel test and the fixes-mode test
    read (each its own nox session and cell run was ~10 CPU-s)."""
    root = tmp_path_factory.mktemp("cancelled")
    token, ready, runs = uuid.uuid4().hex, root / "ready", root / "runs"
    ready.mkdir()
    proc = subprocess.Popen(_nox_args(runs, f"{CASES / 'test_leave_processes.py'}::test_pool_rank_leaves_processes"),
                            cwd=REPO, env=_env(token, DISTCI_FAULT_DIR=str(ready), DISTCI_FIXES="none"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_ready(ready, lambda: proc.poll() is None)
        proc.send_signal(signal.SIGTERM)  # to nox only: the controller hears it from nox
        out, _ = proc.communicate(timeout=240)
        left = procs.with_token(token, {os.getpid()}, prefix=True)
        exit_info = EXIT_FILE.read_text() if EXIT_FILE.exists() else "{}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {"out": out, "runs": runs, "left": left, "exit_info": exit_info}


def test_a_ci_cancel_sigterm_to_nox_alone_closes_the_run(cancelled_run):
    _closed_run(cancelled_run["runs"], cancelled_run["out"], "SIGTERM", cancelled_run["exit_info"])
    assert cancelled_run["left"] == []


def test_distci_fixes_none_runs_the_cell_with_no_fix_applied(cancelled_run):
    (run_dir,) = cancelled_run["runs"].iterdir()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["cell_id"] == CELL.replace("fix_on", "fix_off"), info
    stack = json.loads((run_dir / "stack.json").read_text())
    fixes = stack["fixes"]
    assert fixes and all(f["status"] != "applied" for f in fixes), fixes
    assert {f["status"] for f in fixes} == {"disabled"}, fixes


def test_distci_fixes_ids_are_refused_before_anything_runs(tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.run(_nox_args(runs, f"{CASES / 'test_pool_faults.py'}::test_after_segfault"), cwd=REPO,
                          env=_env(uuid.uuid4().hex, DISTCI_FIXES="nonexistent"), capture_output=True, text=True,
                          timeout=SETUP_S)
    assert proc.returncode != 0
    assert "DISTCI_FIXES: 'nonexistent': a cell run takes `all` or `none`" in proc.stdout + proc.stderr, proc.stdout
    assert not runs.exists() or not any(runs.iterdir())
