"""One torch import per rank pool: the zygote that forks every rank's template.

Spawning a rank worker per rank (`python -m distci.harness.worker`) paid the same import
of torch, torch.distributed and the library modules the tests import lazily once per rank:
1.3-1.4 CPU-s a rank for a trivial suite, more for one that compiles. The pool instead
spawns one zygote (`python -m distci.harness.zygote`). It imports torch and those library
modules once (the stack's learned record, warm.py), then forks each rank's process, which
goes on as that rank's worker (worker.main) with copy-on-write pages of the import.

Why a zygote and not the pytest process forking the ranks itself: pytest's process has
threads, signal handlers, pytest's state and the run directory's lock; the zygote has none
of these (no thread before its forks), and it stays alive as the ranks' parent, so the
death chain holds: controller -> zygote -> each rank's keeper -> worker -> test forks,
each link a PR_SET_PDEATHSIG. The zygote leads the pool's process group (procs.kill_group),
is a child subreaper, and reports each keeper's pid and exit code to the pool, which has
no other way to wait for a process it did not start (`ForkedRank`: Popen's face for it).

What a rank's process sets before anything reads it: RANK and LOCAL_RANK in its
environment, its own log on stdout and stderr, only its own socket pair to the controller.
The selection's test modules are imported by each rank's template after the fork, never by
the zygote: a test module may read its rank's environment at import time.

Where a fork would not work (the device was initialized in the zygote: a CUDA context does
not survive fork), each rank's process execs a fresh worker instead (today's per-rank
spawn, still the zygote's child) and the zygote's log says so. A template that must be
replaced (worker.py: an import initialized the device) is exec'd afresh in its place.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection

from distci.harness import procs
from distci.harness.protocol import RankExited, RankForked, Warm

WORKER = ("-u", "-m", "distci.harness.worker")


# -- the controller's side ----------------------------------------------------------------
class Zygote:
    """The controller's view of one zygote: its process, its channel, the ranks it forked."""

    def __init__(self, proc: subprocess.Popen, conn: Connection) -> None:
        self.proc = proc
        self.conn = conn
        self.forked: dict[int, int] = {}  # rank -> its keeper's pid
        self.exits: dict[int, int] = {}  # rank -> its keeper's exit code
        self.closed = False
        self._unforked_code = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, msg: object) -> None:
        try:
            self.conn.send(msg)
        except OSError:
            pass  # it is gone: its ranks' exit codes say how

    def pump(self, timeout_s: float = 0.0) -> None:
        """Reads what the zygote said so far (waiting up to `timeout_s` for the first word)."""
        if self.closed:
            return
        try:
            while self.conn.poll(timeout_s):
                timeout_s = 0.0
                msg = self.conn.recv()
                if isinstance(msg, RankForked):
                    self.forked[msg.rank] = msg.pid
                elif isinstance(msg, RankExited):
                    self.exits[msg.rank] = msg.code
        except (EOFError, OSError):
            self._closed()

    def _closed(self) -> None:
        """The zygote is gone: a rank it forked and did not report died with it (its keeper's
        PR_SET_PDEATHSIG); a rank it never forked ends the way the zygote did."""
        self.closed = True
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = -signal.SIGKILL
        for rank in self.forked:
            self.exits.setdefault(rank, -signal.SIGKILL)
        self._unforked_code = code

    def returncode(self, rank: int) -> int | None:
        self.pump()
        if rank in self.exits:
            return self.exits[rank]
        if self.closed and rank not in self.forked:
            return self._unforked_code
        return None

    def close(self) -> None:
        self.closed = True
        self.conn.close()


class ForkedRank:
    """Popen's face (pid, returncode, poll, wait) for a rank the zygote forked: the pool
    kills ranks through the zygote's process group and tree, never one by one."""

    def __init__(self, zygote: Zygote, rank: int) -> None:
        self.zygote = zygote
        self.rank = rank

    @property
    def pid(self) -> int:
        """Its keeper's pid (known once the zygote forked it: before it can say anything)."""
        self.zygote.pump()
        if self.rank not in self.zygote.forked:
            raise RuntimeError(f"rank {self.rank}'s process is not forked yet")
        return self.zygote.forked[self.rank]

    @property
    def returncode(self) -> int | None:
        return self.zygote.returncode(self.rank)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.returncode
            if code is not None:
                return code
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"rank {self.rank}", timeout or 0.0)
            self.zygote.pump(min(left, 0.5))


def command(python: str, conn_fd: int, device_type: str, ranks: list[dict]) -> list[str]:
    """The zygote's command line: `ranks` holds, per rank, its worker's argv, its log and the
    fds (its socket pair) it keeps."""
    return [python, "-u", "-m", "distci.harness.zygote", "--fd", str(conn_fd), "--parent", str(os.getpid()),
            "--device-type", device_type, "--ranks", json.dumps(ranks)]


# -- the zygote's side --------------------------------------------------------------------
def _import_torch() -> None:
    """What every rank imports first, imported while the controller collects."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    from distci.harness import worker  # noqa: F401 - what each rank's process runs


def _import_once(device_type: str, warm: Warm) -> str:
    """Once the selection is known: (where templates learn, worker.learns_imports) the library
    modules this stack's tests of `warm.modules` imported lazily before, the imports every
    rank would otherwise pay. Returns why a fork would not work, or ''."""
    from distci.harness import worker
    from distci.harness.devices import device_kind
    from distci.harness.warm import BEFORE_ANY, import_ahead, record_path, remembered

    kind = device_kind(device_type)
    for entry in reversed(warm.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    modules = remembered(record_path(), warm.modules) if worker.learns_imports(device_type) else []
    warmed = import_ahead(modules, kind.initialized)
    if warmed.poisoned is not None or kind.fork_poisoned():
        culprit = "torch" if warmed.poisoned in (None, BEFORE_ANY) else warmed.poisoned
        return f"{kind.name} was initialized in the zygote (by importing {culprit})"
    print(f"distci: zygote imported torch and {len(warmed.imported)} module(s) ahead\n"
          f"  for {len(warm.modules)} test module(s)", flush=True)
    return ""


def _become_rank(rank: int, spec: dict, others: list[int], fork_ok: bool) -> None:
    """In the zygote's child: rank `rank`'s process, which never returns."""
    code = 70
    try:
        for fd in others:
            os.close(fd)
        log = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
        if not fork_ok:
            os.execv(sys.executable, [sys.executable, *WORKER, *spec["argv"]])
        from distci.harness import worker

        code = worker.main(spec["argv"])
    except BaseException:  # noqa: BLE001 - its start failed: the rank log says why
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _fork_ranks(conn: Connection, ranks: list[dict], fork_ok: bool) -> dict[int, int]:
    """Forks every rank's process (each keeps its own fds only); pid -> rank."""
    fds = {rank: spec["fds"] for rank, spec in enumerate(ranks)}
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # the import's objects out of the collector's sight: no copy of their pages
    children = {}
    for rank, spec in enumerate(ranks):
        pid = os.fork()
        if pid == 0:
            others = [conn.fileno()] + [fd for r, own in fds.items() if r != rank for fd in own]
            _become_rank(rank, spec, others, fork_ok)
        children[pid] = rank
        conn.send(RankForked(rank, pid))
    for own in fds.values():  # the ranks' ends are theirs alone now
        for fd in own:
            os.close(fd)
    return children


def _watch(conn: Connection, children: dict[int, int]) -> None:
    """Reaps until every rank's keeper is gone, saying how each ended; orphans adopted on the
    way (the zygote is a subreaper) are reaped too. A word from the controller (Shutdown, or
    its end) needs no answer: the ranks hear it on their own channels."""
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        rank = children.pop(pid, None)
        if rank is not None:
            try:
                conn.send(RankExited(rank, procs.exit_code(status)))
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distci.harness.zygote")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the controller")
    parser.add_argument("--parent", type=int, required=True, help="the controller's pid")
    parser.add_argument("--device-type", required=True)
    parser.add_argument("--ranks", required=True, help="JSON: per rank its worker argv, log and fds")
    args = parser.parse_args(argv)
    procs.die_with_parent()
    procs.become_subreaper()
    if os.getppid() != args.parent:  # the controller died before the death signal was armed
        return 70
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    ranks = json.loads(args.ranks)
    conn = Connection(args.fd)
    _import_torch()
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        return 0
    if not isinstance(msg, Warm):  # Shutdown: the pool closed before its first test
        return 0
    why_not = _import_once(args.device_type, msg)
    if why_not:
        print(f"distci: {why_not}:\n  a fork of it could not use the device, so every rank's\n"
              "  template is spawned afresh (as many imports of torch as ranks)", flush=True)
    children = _fork_ranks(conn, ranks, fork_ok=not why_not)
    _watch(conn, children)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # nothing to tear down: torch's interpreter teardown would only delay the pool
