"""Launch one upstream test: torchrun with N ranks, or upstream's own runner command.

Both ways end in the harness's outcome rules (distci.harness.outcome.combine), so an
upstream test that crashes, hangs or runs past its timeout is classified exactly like a
native one: a dead rank is `crash`, ranks stuck in a collective are `hang` (with every
stuck rank's stack), plain slowness is `timeout`.

- `launch_ranks`: torchrun starts the harness's torchrun entry on every rank, which
  runs one upstream function (distci.external.entry) and writes a per-rank report.
- `launch_command`: an upstream runner (torchtitan's integration runner, pytest) in its
  own process session. At the deadline each rank process of the tree (found by its
  RANK variable) is asked for its Python stack (SIGABRT with PYTHONFAULTHANDLER set),
  then the whole session is killed, so nothing outlives the test.
"""

from __future__ import annotations

import os
import pickle
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import distci
from distci.harness.procs import descendants, kill_tree
from distci.harness.outcome import Combined, RankState, combine
from distci.harness.pool import DUMP_SETTLE_S, dump_stack, worker_env
from distci.harness.protocol import TestRequest
from distci.harness.torchrun import read_rank_reports

from distci.external import readers

DISTCI_ROOT = str(Path(distci.__file__).resolve().parents[1])


@dataclass
class LaunchEnv:
    """Where and how a suite's tests are launched: the cell's python, the upstream checkout,
    and the environment every launch gets on top of the machine's."""

    python: str
    cwd: Path
    device_type: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    fix_site: Path | None = None
    unset: tuple[str, ...] = ()  # machine variables the cell must not see (a controller's PYTHONPATH)

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = worker_env(self.device_type, 1, self.log_dir)
        for name in ("WORLD_SIZE", *self.unset):
            env.pop(name, None)
        env.update(self.env)
        env.update(extra or {})
        # The fix site goes first (the team's patches must win), distci last (only its
        # stdlib-only entry modules are needed where distci is not installed in the cell).
        paths = [str(self.fix_site)] if self.fix_site else []
        paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if DISTCI_ROOT not in paths:
            paths.append(DISTCI_ROOT)
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"
        bin_dir = torchrun_shim(self.python, self.log_dir.parent / "bin")
        env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
        return env


@dataclass
class CaseContext:
    """What an adapter gets to run one case: the launch environment, where its log goes,
    and a scratch directory for upstream's own outputs (checkpoints, traces)."""

    where: LaunchEnv
    log_path: Path
    out_dir: Path


def torchrun_shim(python: str, bin_dir: Path) -> Path:
    """A `torchrun` on PATH that is the cell's own: upstream runners call `torchrun` by name,
    and the first one on the machine's PATH may belong to another Python."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "torchrun"
    text = f"#!/bin/sh\nexec {shlex.quote(python)} -m torch.distributed.run \"$@\"\n"
    if not shim.exists() or shim.read_text() != text:
        shim.write_text(text)
        shim.chmod(0o755)
    return bin_dir


def _log_header(log_path: Path, title: str, cmd: Sequence[str], cwd: Path) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n===== {title} =====\n$ cd {cwd} && {shlex.join(cmd)}\n".encode())
        return log.tell()


def _wait_or_kill(proc: subprocess.Popen, timeout_s: float) -> bool:
    """True when the launch ran past its timeout. If the controller itself is stopped
    (Ctrl-C, SIGTERM from a job timeout) the launch's whole session goes with it: it
    runs in its own session, so nothing else would stop it holding the devices."""
    try:
        proc.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        return True
    except BaseException:
        kill_tree(proc)
        raise


def launch_ranks(test_id: str, target: str, kwargs: dict, nproc: int, timeout_s: float, where: LaunchEnv,
                 log_path: Path, *, env: Mapping[str, str] | None = None) -> tuple[Combined, str]:
    """torchrun `nproc` ranks of `distci.external.entry.<target>(**kwargs)`; returns the outcome and the log."""
    work = Path(tempfile.mkdtemp(prefix="distci-ext-"))
    request = TestRequest(nodeid=test_id, module="distci.external.entry", qualname=target, kwargs=kwargs,
                          sys_path=[str(where.cwd)])
    req_file = work / "request.pkl"
    with open(req_file, "wb") as fh:
        pickle.dump({"request": request, "device_type": where.device_type, "owns_pg": True}, fh)
    cmd = [where.python, "-u", "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--tee=3", "-m", "distci.harness.torchrun_entry", str(req_file)]
    offset = _log_header(log_path, test_id, cmd, where.cwd)
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=where.cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=where.environ({**(env or {}), "WORLD_SIZE": str(nproc)}),
                                start_new_session=True)
    timed_out = _wait_or_kill(proc, timeout_s)
    states = read_rank_reports(work, nproc, timed_out)
    if timed_out:
        time.sleep(DUMP_SETTLE_S)
        kill_tree(proc)
    text = log_path.read_bytes()[offset:].decode("utf-8", "replace")
    readers.fill_rank_states(states, text, returncode=None if timed_out else proc.returncode)
    for st in states:
        if st.stuck and not st.stack:
            st.stack = readers.faulthandler_dump(text, st.rank)
    _kill_leftover_ranks(work, req_file)
    shutil.rmtree(work, ignore_errors=True)
    return combine(states, time.monotonic() - start), text


def _kill_leftover_ranks(work: Path, req_file: Path) -> None:
    """A rank still alive after its launch ended (torchrun's agent died first) is killed;
    its pid file names it, its command line (holding the request file) confirms it."""
    for pid_file in work.glob("rank*.pid"):
        try:
            pid = int(pid_file.read_text())
            if str(req_file) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            continue


@dataclass
class Launched:
    """What an upstream runner command did: its exit, whether it ran out of time, its log."""

    returncode: int | None
    timed_out: bool
    log: str
    duration_s: float
    stuck: list[RankState] = field(default_factory=list)


def _rank_of(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in raw.split(b"\0"):
        if item.startswith(b"RANK="):
            try:
                return int(item[5:])
            except ValueError:
                return None
    return None


def launch_command(title: str, cmd: Sequence[str], timeout_s: float, where: LaunchEnv, log_path: Path,
                   *, env: Mapping[str, str] | None = None) -> Launched:
    """Run an upstream runner command in its own session; on timeout, collect stuck ranks' stacks."""
    offset = _log_header(log_path, title, cmd, where.cwd)
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(cmd), cwd=where.cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=where.environ(env), start_new_session=True)
    timed_out = _wait_or_kill(proc, timeout_s)
    stuck: list[RankState] = []
    if timed_out:
        ranks = {pid: _rank_of(pid) for pid in descendants(proc.pid)}
        chosen = {pid: r for pid, r in ranks.items() if r is not None}
        for pid, rank in sorted(chosen.items(), key=lambda kv: kv[1]):
            state = RankState(rank, stuck=True, stack=dump_stack(pid))
            stuck.append(state)
        for pid in chosen:  # faulthandler (PYTHONFAULTHANDLER=1) prints every thread's stack on SIGABRT
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        time.sleep(DUMP_SETTLE_S)
        kill_tree(proc)
    text = log_path.read_bytes()[offset:].decode("utf-8", "replace")
    for state in stuck:
        if not state.stack:
            state.stack = readers.faulthandler_dump(text, state.rank)
    return Launched(None if timed_out else proc.returncode, timed_out, text, time.monotonic() - start, stuck)
