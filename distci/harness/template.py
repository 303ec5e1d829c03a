"""Isolation by construction: every test runs in a fresh fork of a warm rank template.

A rank worker (worker.py) imports torch once and then only forks. Each test gets a child
that joins a process group of its own, runs the test and leaves with `os._exit`: no
atexit hook, finalizer or flush of the test's runs, and nothing the test changed in its
process (torch's functions, sys.stdout, rlimits, umask, signal handlers, modes, threads,
the RNG, ...) exists for the next test, which gets a new fork of the untouched template.
No list of state kinds is kept, so none can be missing from it.

The cost is hidden: the child for the next test (the "spare") is forked and joins its
process group while the controller records the last test; when the request comes, it is
one pipe message away. Measured in docs/benchmarks.md.

Rules the template keeps so that fork stays safe:
- it never runs a test, a collective or a CUDA call (a CUDA context or a process group's
  threads do not survive fork); the child sets its device and joins its group itself;
- the child closes the template's channel to the controller at once: a test can neither
  read nor break it; the child reports through a pipe of its own, and the template hands
  the report on after the child is gone;
- a child gets SIGKILL when the template dies (PR_SET_PDEATHSIG); what a test leaves
  running is adopted by the template (a child subreaper) and killed before the next fork.
"""

from __future__ import annotations

import datetime
import gc
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from distci.harness import procs
from distci.harness.context import DistContext
from distci.harness.protocol import ChildExit, HealthCheck, RankReport, Started, TestRequest
from distci.harness.warm import newly_imported

EXIT_SETTLE_S = 5.0  # a child that sent its report has this long to be gone before SIGKILL


@dataclass
class Rendezvous:
    """Where and how the children of one pool meet: `init_file` is the pool's FileStore path
    prefix (each test's group gets `<init_file>.t<seq>.pg<its timeout>`); `pg_timeout_s` is the process-group
    timeout of a child whose test names none (the start-up check's, the first spare's)."""

    rank: int
    world_size: int
    device_type: str
    backend: str
    init_file: str
    pg_timeout_s: float
    start_timeout_s: float


def join(rdv: Rendezvous, seq: int | str, pg_timeout_s: float | None = None) -> tuple[DistContext, Any]:
    """The default process group of this process, and the store its ranks met at: every rank
    meets at the store first with the start-up's patience; the group (whose timeout, the
    test's class's or else the pool's, may be a short test's few seconds) is created only
    once all are there."""
    import torch.distributed as dist

    pg_timeout_s = pg_timeout_s or rdv.pg_timeout_s
    # Named by the timeout too: spares dropped for a test of another class met under the same
    # number, and their keys must not let the new children through before their peers came.
    store = dist.FileStore(f"{rdv.init_file}.t{seq}.pg{pg_timeout_s:g}", rdv.world_size)
    store.set_timeout(datetime.timedelta(seconds=rdv.start_timeout_s))
    store.set(f"distci_up_{rdv.rank}", "1")
    store.wait([f"distci_up_{r}" for r in range(rdv.world_size)])
    dist.init_process_group(rdv.backend, store=store, rank=rdv.rank, world_size=rdv.world_size,
                            timeout=datetime.timedelta(seconds=pg_timeout_s))
    return DistContext(rank=rdv.rank, world_size=rdv.world_size, device_type=rdv.device_type,
                       backend=rdv.backend, local_rank=rdv.rank, group=dist.group.WORLD), store


def wait_for_peers(store: Any, rdv: Rendezvous) -> None:
    """A rank done with its test stays until every rank is, as a long-lived rank would: a
    peer still inside a collective it skipped then hangs (and is judged `hang` with its stack)
    instead of failing on a vanished peer. The controller kills whoever still waits when the
    test ends another way."""
    store.set_timeout(datetime.timedelta(days=1))
    store.set(f"distci_done_{rdv.rank}", "1")
    store.wait([f"distci_done_{r}" for r in range(rdv.world_size)])


@dataclass
class Child:
    """One forked child and the pipes to it."""

    pid: int
    seq: int
    requests: Connection  # template -> child: the TestRequest (or the start-up HealthCheck)
    reports: Connection  # child -> template: its RankReport
    pidfd: int | None  # readable once the child has ended (None where the kernel has no pidfd)
    pg_timeout_s: float  # its process group's timeout: a test of another class needs another child
    status: int | None = None  # its wait status, once collected
    max_rss_kb: int = 0  # its peak resident memory, once collected

    def close(self) -> None:
        for end in (self.requests, self.reports):
            end.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def settle_thread_pool() -> None:
    """In a fresh fork, while it has one thread: let torch remake its intra-op thread pool now.

    The template set the pool's size (worker._warm_up), so torch's fork handler marks the
    pool corrupt in every child, and the next call that reads the pool leaks it and makes a
    new one, without a lock: a thread that reads it in between gets none. A test's first
    backward starts autograd's device threads together (8 under FSDP2 with torch
    2.15.0+cu132 on a CPU-only machine), each reading the pool as it starts: one read it in
    between and aborted its rank, "pool INTERNAL ASSERT FAILED ... ParallelOpenMP.cpp:64
    ... Invalid thread pool!" (19 of 435 results of a 62-minute programs run on torch 2.15.0
    at load ~58, 2026-12-07; forked workers of users meet it too: pytorch#178535). Setting the
    size it already has reads the pool once here, before any other thread exists. A torch
    without the call, or not imported, is left alone."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        torch.set_num_threads(torch.get_num_threads())
    except Exception:  # noqa: BLE001 - a build without the pool's size to set: nothing to settle
        pass


Runner = Callable[[object, DistContext], RankReport]
"""Runs what the child received (a TestRequest or the start-up HealthCheck) on its rank."""


class Template:
    """Forks, feeds and reaps the children of one rank worker."""

    def __init__(self, rdv: Rendezvous, controller_fd: int, run: Runner,
                 child_setup: Callable[[], None] = lambda: None) -> None:
        self.rdv = rdv
        self.controller_fd = controller_fd
        self.run = run
        self.child_setup = child_setup
        self.spare: Child | None = None
        self.running: Child | None = None  # a child that reported and waits for its peers
        # The process-group timeout the next spare joins with: the last test's (tests of one
        # timeout class run side by side), so one pool serves every class of its world size.
        self.spare_pg_timeout_s = rdv.pg_timeout_s

    # -- the child's side ------------------------------------------------------------
    def _child_main(self, seq: int, pg_timeout_s: float, requests: Connection, reports: Connection) -> int:
        procs.die_with_parent()
        settle_thread_pool()
        before = frozenset(sys.modules)
        self.child_setup()
        ctx, store = join(self.rdv, seq, pg_timeout_s)
        try:
            request = requests.recv()
        except (EOFError, OSError):  # the template dropped this spare
            return 0
        report = self.run(request, ctx)
        report.info["imported"] = newly_imported(before)  # for the template to import ahead of the next fork
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a stream the test closed or replaced
                pass
        reports.send(report)
        wait_for_peers(store, self.rdv)
        return 0

    def fork(self, seq: int, pg_timeout_s: float | None = None) -> Child:
        pg_timeout_s = pg_timeout_s or self.rdv.pg_timeout_s
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        gc.freeze()  # the template's objects out of the collector's sight: a collection in the child
        # would write to every object's header and copy the template's pages one by one
        with warnings.catch_warnings():  # 3.12+: "multi-threaded, fork() may deadlock": the template's
            warnings.simplefilter("ignore", DeprecationWarning)  # threads hold no lock the child needs
            pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 70
            try:
                os.close(self.controller_fd)
                os.close(req_w)
                os.close(rep_r)
                code = self._child_main(seq, pg_timeout_s, Connection(req_r, writable=False),
                                        Connection(rep_w, readable=False))
            except BaseException:  # noqa: BLE001 - its own start failed: the log says why
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(req_r)
        os.close(rep_w)
        return Child(pid, seq, Connection(req_w, readable=False), Connection(rep_r, writable=False), procs.pidfd(pid),
                     pg_timeout_s)

    # -- the template's side ---------------------------------------------------------
    def start_up(self) -> RankReport | ChildExit:
        """The first child answers the start-up HealthCheck (a collective with a known answer);
        the spare for the pool's first test is forked beside it, so it joins its group while
        the check runs (each has a group of its own: the check leaves no trace in the test's)."""
        check = self.fork(0)
        self.spare = self.fork(1)
        outcome = self._serve(check, HealthCheck())
        self.finish()
        if not isinstance(outcome, RankReport) or outcome.outcome != "passed":
            self.drop_spare()
        return outcome

    def test(self, request: TestRequest, controller: Connection) -> RankReport | ChildExit:
        """Runs one test in the spare (forked anew when its number is not the request's: the
        spare's peers are the other ranks' spares of the same number; or when its process group
        has another timeout than the test's class)."""
        pg_timeout_s = request.pg_timeout_s or self.rdv.pg_timeout_s
        self.spare_pg_timeout_s = pg_timeout_s
        child = self.spare
        if child is None or child.seq != request.seq or child.pg_timeout_s != pg_timeout_s or _ended(child):
            self.drop_spare()
            child = self.fork(request.seq, pg_timeout_s)
        self.spare = None
        controller.send(Started(self.rdv.rank, child.pid))
        return self._serve(child, request)

    def fork_spare(self, seq: int) -> None:
        self.spare = self.fork(seq, self.spare_pg_timeout_s)

    def drop_spare(self) -> None:
        if self.spare is not None:
            procs.kill_pids([self.spare.pid])
            _reap(self.spare)
            self.spare = None

    def _serve(self, child: Child, request: object) -> RankReport | ChildExit:
        try:
            child.requests.send(request)
        except OSError:
            pass  # it is gone already: its exit code says how
        report: RankReport | None = None
        watched = [child.reports] + ([child.pidfd] if child.pidfd is not None else [])
        while report is None:
            ready = wait(watched, timeout=None if child.pidfd is not None else 0.5)
            if child.reports in ready:
                try:
                    report = child.reports.recv()
                    break
                except (EOFError, OSError):
                    watched.remove(child.reports)  # it ended (or closed the pipe): see its exit
            if child.pidfd in ready or _ended(child) or not watched:
                break
        if report is not None:
            self.running = child  # it waits for its peers: finish() reaps it
            return report
        code = _reap(child)
        return ChildExit(self.rdv.rank, code if code is not None else -9, child.max_rss_kb)

    def finish(self) -> None:
        """After the outcome went to the controller: the test's process gone (it waits for its
        peers first; the controller kills it if a peer never comes), what it left killed."""
        if self.running is not None:
            _reap(self.running)
            self.running = None

    def kill_leftovers(self) -> list[int]:
        """Everything under the template except the spare: what the last test left running
        (adopted here, as the template is a child subreaper)."""
        keep = set()
        if self.spare is not None:
            keep = {self.spare.pid, *procs.descendants(self.spare.pid)}
        return procs.kill_descendants(os.getpid(), keep=keep)


def _ended(child: Child) -> bool:
    """Has the child ended (its wait status then kept on it for _reap)?"""
    if child.status is not None:
        return True
    try:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
    except ChildProcessError:
        return True
    if pid == child.pid:
        child.status, child.max_rss_kb = status, usage.ru_maxrss
        return True
    return False


def _reap(child: Child, settle_s: float | None = None) -> int | None:
    """Waits for the child (SIGKILL after `settle_s`); its exit code, Popen's way."""
    status = child.status
    deadline = None if settle_s is None else time.monotonic() + settle_s
    while status is None:
        try:
            pid, found, usage = os.wait4(child.pid, os.WNOHANG if deadline is not None else 0)
        except ChildProcessError:
            break
        if pid == child.pid:
            status, child.max_rss_kb = found, usage.ru_maxrss
        elif deadline is not None and time.monotonic() >= deadline:
            procs.kill_pids([child.pid])
            deadline = None
        else:
            time.sleep(0.001)
    child.close()
    return None if status is None else procs.exit_code(status)
