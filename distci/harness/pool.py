"""RankPool: N rank workers that live for the whole pytest session.

Starting ranks (spawn Python, import torch) costs seconds; a suite has hundreds of tests.
The pool pays that once per world size, and once for all its ranks: one zygote imports
torch and forks every rank (zygote.py). Each worker is a template that runs every test in
a fresh fork of itself, with a process group of its own (template.py): nothing a test does
to its processes reaches the next test, so there is nothing to check or reset between
tests. A hang, a crash or a timeout kills that test's processes only; the pool is rebuilt
only when a worker itself is lost (a test that killed it, a broken control channel).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

from distci.harness import machine, procs
from distci.harness.outcome import Combined, RankState, combine, describe_exit
from distci.harness.timeouts import load_at_timeout
from distci.harness.protocol import CHANNEL_BROKEN_EXIT, ChildExit, RankReport, Shutdown, Started, TestRequest, Warm
from distci.harness.zygote import ForkedRank, Zygote, command as zygote_command

FAILURE_GRACE_S = 10.0  # other ranks' time to finish after one rank failed or died
DUMP_SETTLE_S = 1.5
DEFAULT_PG_TIMEOUT_S = 240.0  # a test's process group's, where the test names no class
DRAIN_S = 10.0  # a worker's time to report that the test's killed process is gone


class PoolStartError(RuntimeError):
    """The ranks could not be brought up or failed the health check: an infra problem."""

    def __init__(self, message: str, logs: str = "") -> None:
        self.logs = logs
        super().__init__(message)


@dataclass
class _Rank:
    rank: int
    proc: ForkedRank
    conn: Connection
    dump_sock: socket.socket | None
    log_path: Path
    log_offset: int = 0
    worker_pid: int = 0  # the worker under `proc` (its keeper, procs.keep_tree): the forks' parent


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def worker_env(device_type: str, world_size: int, trace_dir: Path, token: str = "") -> dict[str, str]:
    env = dict(os.environ)
    env[procs.RUN_TOKEN_ENV] = token or procs.run_token()
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env["WORLD_SIZE"] = str(world_size)
    if device_type == "cuda":
        env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
        env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        env.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(trace_dir / "nccl_trace_rank_"))
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(trace_dir / "nccl_trace_rank_"))
    return env


def dump_stack(pid: int) -> str:
    """py-spy's view of a process when py-spy is installed and allowed to attach."""
    exe = shutil.which("py-spy")
    if not exe:
        return ""
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
    except (subprocess.TimeoutExpired, OSError):
        return ""
    return out.stdout if out.returncode == 0 else ""


class RankPool:
    def __init__(
        self,
        world_size: int,
        device_type: str,
        log_dir: Path,
        *,
        pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S,
        start_timeout_s: float = 300.0,
        python: str = sys.executable,
        token: str = "",
        isolate: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.isolate = isolate  # False: tests run in the workers themselves (--distci-no-isolation)
        self.env = dict(env or {})  # set in the ranks' environment (the compile cache's directory)
        self.seq = 0  # tests sent since the workers started: the forked ranks of one test meet under it
        self._oom_kills: int | None = None  # the cgroup's OOM kills when the test in flight began
        self.token = token or procs.run_token()
        self.world_size = world_size
        self.device_type = device_type
        self.log_dir = Path(log_dir)
        self.pg_timeout_s = pg_timeout_s
        self.start_timeout_s = start_timeout_s
        self.python = python
        self.ranks: list[_Rank] = []
        self.pgid: int | None = None
        self.generation = 0
        self.health: list[RankReport] = []
        self.init_dir: Path | None = None
        self._warm_pending = False  # launched ranks still wait for their Warm message
        self.zygote: Zygote | None = None  # the process that imported torch once and forked the ranks

    @property
    def alive(self) -> bool:
        return bool(self.ranks) and all(r.proc.poll() is None for r in self.ranks)

    def pids(self) -> list[int]:
        """The zygote and the ranks' keepers it forked: every process of the pool is under
        one of them (read without waiting: a signal handler calls this)."""
        if self.zygote is None:
            return []
        return [self.zygote.pid, *self.zygote.forked.values()]

    @property
    def ready(self) -> bool:
        """Started and its start-up health check answered (launch() alone does not wait)."""
        return self.alive and bool(self.health)

    # -- start / stop -------------------------------------------------------------
    def start(self, warm: Warm | None = None) -> None:
        """launch() and wait for the ranks' start-up health check (PoolStartError if it fails)."""
        self.launch(warm)
        self.await_ready()

    def await_ready(self) -> None:
        """Waits for the start-up health check of launched ranks (PoolStartError if it fails)."""
        if self.ready:
            return
        if not self.ranks:
            raise PoolStartError("the pool was never launched")
        if self._warm_pending:
            self.send_warm(Warm(sys_path=list(sys.path)))
        self.health = self._collect_health(self.start_timeout_s, "start-up")
        for r, report in zip(self.ranks, self.health):
            r.worker_pid = int(report.info.get("worker_pid") or r.proc.pid)

    def send_warm(self, warm: Warm) -> None:
        """What the ranks import before they fork their first test's process (their first
        message; each waits for it once torch is imported)."""
        if not self._warm_pending:
            return
        if self.zygote is not None:
            self.zygote.send(warm)
        for r in self.ranks:
            try:
                r.conn.send(warm)
            except OSError:
                pass  # a rank that died: await_ready() says how
        self._warm_pending = False

    def launch(self, warm: Warm | None = None) -> None:
        """Spawns the pool's zygote without waiting for it: it imports torch while the
        controller goes on (collecting, say), and forks the rank workers once `warm` came
        (sent now, or later by send_warm())."""
        self.kill()
        self.generation += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        trace_dir = self.log_dir / "traces"
        trace_dir.mkdir(exist_ok=True)
        init_dir = Path(tempfile.mkdtemp(prefix="distci-pg-"))
        init_file = init_dir / "store"
        env = dict(worker_env(self.device_type, self.world_size, trace_dir, self.token), **self.env)
        for name in ("RANK", "LOCAL_RANK"):  # each rank's process sets its own (zygote.py)
            env.pop(name, None)
        specs, theirs_all, conns = [], [], []
        for rank in range(self.world_size):
            ours, theirs = socket.socketpair()
            dump_ours, dump_theirs = socket.socketpair()
            log_path = self.log_dir / f"ws{self.world_size}-rank{rank}.log"
            with open(log_path, "ab") as log:
                log.write(f"\n===== distci pool generation {self.generation} =====\n".encode())
            argv = [
                "--rank", str(rank), "--world-size", str(self.world_size),
                "--device-type", self.device_type, "--init-file", str(init_file),
                "--fd", str(theirs.fileno()), "--dump-fd", str(dump_theirs.fileno()),
                "--pg-timeout", str(self.pg_timeout_s), "--start-timeout", str(self.start_timeout_s),
                "--trace-dir", str(trace_dir),
            ] + ([] if self.isolate else ["--in-place"])
            specs.append({"argv": argv, "log": str(log_path), "fds": [theirs.fileno(), dump_theirs.fileno()]})
            theirs_all += [theirs, dump_theirs]
            conns.append((rank, Connection(ours.detach()), dump_ours, log_path))
        zyg_ours, zyg_theirs = socket.socketpair()
        with open(self.zygote_log, "ab") as log:
            log.write(f"\n===== distci pool generation {self.generation} =====\n".encode())
            log.flush()
            proc = subprocess.Popen(
                zygote_command(self.python, zyg_theirs.fileno(), self.device_type, specs),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                pass_fds=(zyg_theirs.fileno(), *(sock.fileno() for sock in theirs_all)),
                **({"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": lambda: os.setpgid(0, 0)}),
            )
        for sock in (zyg_theirs, *theirs_all):
            sock.close()
        self.zygote = Zygote(proc, Connection(zyg_ours.detach()))
        self.pgid = proc.pid
        for rank, conn, dump_ours, log_path in conns:
            self.ranks.append(_Rank(rank, ForkedRank(self.zygote, rank), conn, dump_ours, log_path))
        # The FileStore stays while the ranks live: every later new_group (a 2-D
        # DeviceMesh's dim groups) creates its gloo/NCCL backend through it.
        self.init_dir = init_dir
        self.seq = 0
        self.health = []
        self._warm_pending = True
        if warm is not None:
            self.send_warm(warm)

    def _collect_health(self, timeout_s: float, what: str) -> list[RankReport]:
        reports: dict[int, RankReport] = {}
        deadline = time.monotonic() + timeout_s
        by_conn = {r.conn: r for r in self.ranks}
        while len(reports) < len(self.ranks):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for conn in wait([r.conn for r in self.ranks if r.rank not in reports], timeout=min(left, 1.0)):
                r = by_conn[conn]
                try:
                    got = conn.recv()
                except (EOFError, OSError):
                    self._fail_start(f"rank {r.rank} died during {what} (it {describe_exit(self._exit_code(r))})")
                if isinstance(got, ChildExit):
                    self._fail_start(f"rank {r.rank}'s first forked process {describe_exit(got.code)} during {what}")
                reports[r.rank] = got
            for r in self.ranks:
                if r.rank not in reports and r.proc.poll() is not None:
                    self._fail_start(f"rank {r.rank} exited with code {r.proc.returncode} during {what}")
        if len(reports) < len(self.ranks):
            missing = sorted(set(range(len(self.ranks))) - set(reports))
            self._fail_start(f"ranks {missing} did not finish {what} within {timeout_s:.0f}s")
        bad = [rep for rep in reports.values() if rep.outcome != "passed"]
        if bad:
            self._fail_start(f"{what} failed on rank {bad[0].rank}: {bad[0].exc_type}: {bad[0].message}")
        return [reports[i] for i in sorted(reports)]

    @property
    def zygote_log(self) -> Path:
        return self.log_dir / f"ws{self.world_size}-zygote.log"

    def _fail_start(self, message: str) -> None:
        logs = "\n".join([f"--- zygote ---\n{_read_from(self.zygote_log, 0)[-2000:]}"] +
                          [f"--- rank {r.rank} ---\n{_read_from(r.log_path, 0)[-4000:]}" for r in self.ranks])
        self.kill()
        raise PoolStartError(message, logs)

    def kill(self) -> None:
        """SIGKILL the zygote, the ranks it forked, their process group and every descendant
        (the zygote and each rank are child subreapers, so what tests started in sessions of
        their own is still under them)."""
        zygote = self.zygote
        if zygote is not None:
            if zygote.proc.returncode is None:  # a waited-for zygote's pid may be another's
                procs.kill_descendants(zygote.pid)
            procs.kill_group(zygote.proc)
            try:
                zygote.proc.kill()
            except ProcessLookupError:
                pass
            try:
                zygote.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for r in self.ranks:
            r.conn.close()
            if r.dump_sock:
                r.dump_sock.close()
        if zygote is not None:
            zygote.close()
        self.zygote = None
        self.ranks = []
        self.health = []
        self._warm_pending = False
        self.pgid = None
        if self.init_dir is not None:
            shutil.rmtree(self.init_dir, ignore_errors=True)
            self.init_dir = None

    def shutdown(self, timeout_s: float = 10.0) -> None:
        if self.zygote is not None:  # one still waiting for its Warm message forks no rank: it ends
            self.zygote.send(Shutdown())
        for r in self.ranks:
            try:
                r.conn.send(Shutdown())
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for r in self.ranks:
            try:
                r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    # -- running tests ------------------------------------------------------------
    def run(self, request: TestRequest, timeout_s: float) -> Combined:
        if not self.alive:
            self.start(Warm([request.module], list(request.sys_path)))
        self.await_ready()
        self.seq += 1
        request.seq = self.seq
        start = time.monotonic()
        for r in self.ranks:
            r.log_offset = r.log_path.stat().st_size
        states = {r.rank: RankState(r.rank) for r in self.ranks}
        self._oom_kills = machine.oom_kills()
        for r in self.ranks:
            r.conn.send(request)
        self._wait(states, start + timeout_s)
        stuck = [self._rank(s.rank) for s in states.values() if s.stuck]
        progress: dict[int, bool] = {}
        if stuck:
            pids = {r.rank: states[r.rank].pid or r.proc.pid for r in stuck}
            advancing = procs.cpu_advancing(list(pids.values()))
            progress = {rank: advancing[pid] for rank, pid in pids.items()}
            self._dump_stacks(stuck, states)
        duration = time.monotonic() - start  # until the outcome is known, stacks included
        clean = all(s.report is not None and s.report.outcome in ("passed", "skipped") for s in states.values())
        settled = self._end_test(stuck, clean)
        for r in self.ranks:
            states[r.rank].log = _read_from(r.log_path, r.log_offset)
        ordered = [states[i] for i in sorted(states)]
        combined = combine(ordered, duration)
        if combined.failure_kind in ("timeout", "hang") and stuck:
            combined.load = load_at_timeout(ordered, progress)
        if self.isolate:
            combined.needs_rebuild = not settled
        if combined.needs_rebuild:
            self.kill()
        return combined

    def _end_test(self, stuck: list[_Rank], clean: bool) -> bool:
        """After a test that did not end cleanly on every rank: kills every rank's processes
        under the workers (the test's, ranks waiting for a peer that never comes, the spares),
        waits for the `stuck` ranks' workers to say their test process is gone, and moves the
        next test's number on by one more, so every worker forks afresh for it. False when a
        worker is lost (the pool must be rebuilt)."""
        if not self.isolate:
            return not stuck and self.alive
        if clean:
            return self.alive
        for r in self.ranks:  # the workers' trees, not the workers
            procs.kill_descendants(r.worker_pid or r.proc.pid)
        self.seq += 1
        deadline = time.monotonic() + DRAIN_S
        for r in stuck:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not r.conn.poll(min(left, 0.5)):
                    if left <= 0 or r.proc.poll() is not None:
                        return False
                    continue
                try:
                    if isinstance(r.conn.recv(), (ChildExit, RankReport)):
                        break
                except (EOFError, OSError):
                    return False
        return self.alive

    def _rank(self, rank: int) -> _Rank:
        return self.ranks[rank]

    def _wait(self, states: dict[int, RankState], deadline: float) -> None:
        by_conn = {r.conn: r for r in self.ranks}
        pending = {r.rank for r in self.ranks}
        while pending:
            now = time.monotonic()
            trouble = any(s.exit_code is not None or (s.report and s.report.outcome == "failed") for s in states.values())
            if trouble:
                deadline = min(deadline, now + FAILURE_GRACE_S)
            left = deadline - now
            if left <= 0:
                break
            for conn in wait([self.ranks[i].conn for i in pending], timeout=min(left, 0.5)):
                r = by_conn[conn]
                try:
                    got = conn.recv()
                except (EOFError, OSError) as exc:
                    states[r.rank].exit_code = self._exit_code(r)
                    if states[r.rank].exit_code == -signal.SIGKILL:
                        states[r.rank].oom = machine.oom_evidence(r.proc.pid, 0, self._oom_kills)
                    if states[r.rank].exit_code is None or states[r.rank].exit_code == CHANNEL_BROKEN_EXIT:
                        states[r.rank].channel = f"{type(exc).__name__} on the socket"
                    pending.discard(r.rank)
                    continue
                if isinstance(got, Started):
                    states[r.rank].pid = got.pid
                    continue
                if isinstance(got, ChildExit):
                    states[r.rank].exit_code = got.code
                    if got.code == -signal.SIGKILL:  # the harness kills nothing before the outcome is known
                        states[r.rank].oom = machine.oom_evidence(states[r.rank].pid or -1, got.max_rss_kb,
                                                                self._oom_kills)
                else:
                    states[r.rank].report = got
                pending.discard(r.rank)
            for i in list(pending):
                code = self.ranks[i].proc.poll()
                if code is not None:
                    states[i].exit_code = code
                    pending.discard(i)
        for i in pending:
            states[i].stuck = True

    @staticmethod
    def _exit_code(r: _Rank) -> int | None:
        """The rank's exit code, waiting a little for it; None while it still runs."""
        try:
            return r.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def _dump_stacks(self, stuck: list[_Rank], states: dict[int, RankState]) -> None:
        for r in stuck:
            if self.device_type == "cuda" and r.dump_sock is not None:
                try:
                    r.dump_sock.send(b"d")
                except OSError:
                    pass
            try:
                os.kill(states[r.rank].pid or r.proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        self._await_dumps(stuck)
        for r in stuck:
            spy = dump_stack(states[r.rank].pid or r.proc.pid)
            faulthandler_text = _read_from(r.log_path, r.log_offset)
            found = [i for i in (faulthandler_text.find("Thread 0x"), faulthandler_text.find("Current thread 0x")) if i >= 0]
            fh_stack = faulthandler_text[min(found):] if found else ""
            states[r.rank].stack = (f"py-spy dump:\n{spy}\n" if spy else "") + (
                f"faulthandler:\n{fh_stack}" if fh_stack else "")

    def _await_dumps(self, stuck: list[_Rank], limit_s: float = 8.0) -> None:
        """Waits until every stuck rank's faulthandler dump is in its log (or the limit passes).

        A fixed pause is not enough: a rank busy in a CUDA/NCCL call can take seconds to
        get its dump out, and a missing stack makes a hang undiagnosable.
        """
        time.sleep(DUMP_SETTLE_S)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if all("Current thread 0x" in _read_from(r.log_path, r.log_offset) for r in stuck):
                return
            time.sleep(0.25)
