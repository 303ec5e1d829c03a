"""torchrun mode: one `torchrun` launch per test.

For tests that create their own process group (torchtitan's trainer, upstream scripts)
and for bisect probes, which must not depend on a long-lived pool. Slower than the pool
(every launch imports torch and rendezvous anew) but with nothing shared between tests.

It classifies a bug the way the pool does: each rank writes its own log
(`torchrun-rank<N>.log`) and its report, and a rank that finished waits for its peers'
reports before it leaves, as a pool rank would stay in the pool; so a rank that skipped
a collective leaves its peer hung (`hang`), not failing on a vanished peer (`exception`).
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distci.harness.outcome import Combined, RankState, combine
from distci.harness.pool import DUMP_SETTLE_S, dump_stack, worker_env
from distci.harness import procs
from distci.harness.procs import kill_tree
from distci.harness.protocol import TestRequest


START_TIMEOUT_S = 300.0


def _await_ready(proc: subprocess.Popen, work: Path, nproc: int, limit_s: float) -> None:
    """Waits until every rank is in its test (torchrun, torch's import and the process
    group's rendezvous are start-up, as a pool's are) or the launch ended."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        if all((work / f"rank{rank}.ready").exists() for rank in range(nproc)):
            return
        time.sleep(0.1)


def read_rank_reports(work: Path, nproc: int, timed_out: bool) -> list[RankState]:
    """Each rank's report from `work` (written by torchrun_entry); at a timeout, the ranks
    without one are marked stuck and asked for their stacks before anything is killed."""
    states = [RankState(rank) for rank in range(nproc)]
    for st in states:
        rep_file = work / f"rank{st.rank}.report.pkl"
        pid_file = work / f"rank{st.rank}.pid"
        if rep_file.exists():
            with open(rep_file, "rb") as fh:
                st.report = pickle.load(fh)
        elif timed_out:
            st.stuck = True  # in its test, or never got there: either way not done in time
            if pid_file.exists():
                pid = int(pid_file.read_text())
                try:
                    os.kill(pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
                st.stack = dump_stack(pid)
    return states


def launch(
    request: TestRequest,
    nproc: int,
    device_type: str,
    timeout_s: float,
    log_dir: Path,
    *,
    owns_process_group: bool,
    pg_timeout_s: float | None = None,
    token: str = "",
    python: str = sys.executable,
) -> Combined:
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="distci-torchrun-"))
    req_file = write_request(work, request, device_type, timeout_s, log_dir,
                             owns_process_group=owns_process_group, pg_timeout_s=pg_timeout_s)
    log_path = log_dir / "torchrun.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    rank_logs = [log_dir / f"torchrun-rank{rank}.log" for rank in range(nproc)]
    rank_offsets = [p.stat().st_size if p.exists() else 0 for p in rank_logs]
    cmd = [
        python, "-u", "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "distci.harness.torchrun_entry", str(req_file),
    ]
    token = token or procs.run_token()
    env = worker_env(device_type, nproc, log_dir, token)
    start = time.monotonic()
    with open(log_path, "ab") as log:
        log.write(f"\n===== torchrun {request.nodeid} =====\n".encode())
        log.flush()
        proc = procs.start_owned(cmd, env=env, token=token, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    timed_out = False
    try:
        _await_ready(proc, work, nproc, START_TIMEOUT_S)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BaseException:  # the run is being stopped: its own session would outlive it
        kill_tree(proc)
        shutil.rmtree(work, ignore_errors=True)
        raise
    states = read_rank_reports(work, nproc, timed_out)
    for st in states:
        if st.report is None and not timed_out:
            st.exit_code = proc.returncode if proc.returncode else 1
    if timed_out:
        time.sleep(DUMP_SETTLE_S)
    kill_tree(proc)
    shutil.rmtree(work, ignore_errors=True)
    attach_logs(states, rank_logs, rank_offsets, log_path.read_bytes()[offset:].decode("utf-8", "replace"))
    return combine(states, time.monotonic() - start)


def write_request(work: Path, request: TestRequest, device_type: str, timeout_s: float, log_dir: Path, *,
                  owns_process_group: bool, pg_timeout_s: float | None) -> Path:
    """The file torchrun_entry reads on every rank (one launch's `work` directory, which
    every node of a multi-node launch shares: distci.launch)."""
    req_file = work / "request.pkl"
    with open(req_file, "wb") as fh:
        pickle.dump({"request": request, "device_type": device_type, "owns_pg": owns_process_group,
                     "pg_timeout_s": pg_timeout_s, "timeout_s": timeout_s, "log_dir": str(log_dir)}, fh)
    return req_file


def attach_logs(states: list[RankState], rank_logs: list[Path], offsets: list[int], agent_log: str) -> None:
    """Each rank's log lines of this launch (else the agents' tail), and a stuck rank's
    stack from its faulthandler dump when py-spy gave none."""
    for st, path, at in zip(states, rank_logs, offsets):
        st.log = _read_from(path, at) or agent_log[-4000:]
        if st.stuck and not st.stack:
            st.stack = _faulthandler_part(st.log)


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _faulthandler_part(log: str) -> str:
    found = [i for i in (log.find("Thread 0x"), log.find("Current thread 0x")) if i >= 0]
    return log[min(found):] if found else ""
