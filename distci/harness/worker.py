"""A rank worker: one long-lived process per rank that runs each test in a fresh fork of itself.

Forked by the pool's zygote (zygote.py: torch imported once for all ranks), or started
as `python -m distci.harness.worker` where a fork would not work. The worker is a warm template:
it has imported torch, then its tests' modules (the controller's Warm message, before its
first fork) and the torch modules its tests turned out to import (warm.py), and never runs a
test itself. Every test runs in a child forked from it (templates.py): whatever the test does
to its process (a patched torch, a replaced sys.stdout, a lowered rlimit, an atexit hook, a
mode left on) ends with that child, so isolation needs no list of what to reset. The child
joins a process group of its own per test (a FileStore rendezvous), forked ahead of the
request so the join overlaps the controller's work between tests.

`--in-place` runs the tests in the worker itself, one process group for the pool's life,
nothing reset: only to show what isolation prevents. The worker dies with its controller
(PR_SET_PDEATHSIG and a parent watchdog), and every test child with the worker.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Callable, Iterator

from distci.harness import procs
from distci.harness.context import DistContext
from distci.harness.devices import device_kind
from distci.harness.execute import execute, prepare_path
from distci.harness.isolation import reseed
from distci.harness.protocol import CHANNEL_BROKEN_EXIT, HealthCheck, RankReport, Shutdown, Started, TestRequest, Warm
from distci.harness.template import Rendezvous, Template, join
from distci.harness.warm import (BEFORE_ANY, JOINING, OPTIMIZER_IMPORTS, import_ahead, newly_imported, record_path,
                                 remember, remembered)


def _die_with_parent(parent_pid: int) -> None:
    """The kernel kills this rank when its keeper (procs.keep_tree), and so the controller,
    dies; as a rank is a subreaper, what its tests start (and leave orphaned) stays under it,
    where it is killed after the test."""
    procs.die_with_parent()
    procs.become_subreaper()

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                procs.kill_descendants(os.getpid())
                os._exit(70)
            time.sleep(1.0)

    threading.Thread(target=watch, name="distci-parent-watch", daemon=True).start()


def _serve_dumps(fd: int, path: str) -> None:
    """A thread that dumps the NCCL flight recorder on request.

    A signal handler would not do: the main thread of a hung rank sits inside a C++
    collective and Python handlers only run between bytecodes. Collectives release the
    GIL while they wait, so this thread can still run.
    """

    def serve() -> None:
        while True:
            try:
                if not os.read(fd, 1):
                    return
            except OSError:
                return
            _flight_recorder_dump(path)

    threading.Thread(target=serve, name="distci-flight-recorder", daemon=True).start()


def _flight_recorder_dump(path: str) -> None:
    """Writes the NCCL flight recorder to `path` (CUDA only; best effort)."""
    try:
        import torch

        data = torch._C._distributed_c10d._dump_nccl_trace()
        with open(path, "wb") as fh:
            fh.write(data)
    except Exception as exc:  # noqa: BLE001
        print(f"distci: flight recorder dump failed: {exc}", file=sys.stderr, flush=True)


def arm_stack_dumps() -> None:
    """SIGUSR1 makes faulthandler write every thread's stack (how the controller sees a hang).
    Re-armed before every test: a test that set SIGUSR1 to SIG_IGN (or its own handler)
    would otherwise blind the hang detector for every later test. register() alone keeps a
    stale registration as it is, hence unregister first."""
    faulthandler.unregister(signal.SIGUSR1)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def _rendezvous(args: argparse.Namespace) -> Rendezvous:
    kind = device_kind(args.device_type)
    return Rendezvous(rank=args.rank, world_size=args.world_size, device_type=kind.name, backend=kind.backend,
                      init_file=args.init_file, pg_timeout_s=args.pg_timeout, start_timeout_s=args.start_timeout)


def _warm_up(args: argparse.Namespace) -> None:
    """What every test imports: torch and its distributed package (seconds). Dynamo and
    inductor come with the test modules that use them (the Warm message) or are learned
    from the tests (warm.py): a selection that never compiles never pays for them. Nothing
    here may start a CUDA context or a process group."""
    import torch
    import torch.distributed  # noqa: F401

    if device_kind(args.device_type).name == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world_size))


def learns_imports(device_type: str) -> bool:
    """Does a template of this device learn what its tests import lazily (warm.py)? On CPU
    only. On an H100 (2026-12-06) the torch modules a compiled test pulls in included one
    that starts CUDA at import (inductor's device queries); every batch that imported it,
    directly or through another module, poisoned fork, so the template was replaced after
    each test and compiled rows ran slower than with no learning at all
    (reports/gpu/2026-12-06-1gpu-fork-per-test.md)."""
    return device_kind(device_type).name == "cpu"


@dataclass
class WarmState:
    """What this worker's template imports ahead (the Warm message, then what tests taught
    it) and what it must not (imports that initialized the device); kept across a
    replacement of the template (`--replaced`)."""

    modules: list[str] = field(default_factory=list)
    sys_path: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    serving: bool = False  # replaced after its start-up: the controller awaits test outcomes only


def _receive_warm(conn: Connection) -> WarmState | None:
    """The controller's Warm message (always its first); None when it said Shutdown or left."""
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        return None
    if isinstance(msg, Shutdown):
        return None
    if not isinstance(msg, Warm):
        raise RuntimeError(f"the controller's first message is {type(msg).__name__}, not Warm")
    return WarmState(list(msg.modules), list(msg.sys_path))


def _add_path(entries: list[str]) -> None:
    for entry in reversed(entries):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def _import_ahead(args: argparse.Namespace, state: WarmState, modules: list[str]) -> bool:
    """Imports `modules` into the template. True when one initialized the device: the
    template must then be replaced before it forks again (a process with a CUDA context
    cannot fork working ranks); the module is in `state.skip` and said so once."""
    _add_path(state.sys_path)
    kind = device_kind(args.device_type)
    warmed = import_ahead(modules, kind.initialized, skip=state.skip)
    for name, error in warmed.failed.items():
        print(f"distci: the worker could not import {name} ahead ({error}); its tests import it", flush=True)
    if warmed.poisoned == BEFORE_ANY:
        raise RuntimeError(f"{kind.name} was initialized in the rank template before it imported anything ahead "
                           "(by torch's import, a fix or a plugin): it cannot fork ranks that use the device")
    if warmed.poisoned is None and warmed.imported and kind.fork_poisoned():
        # Started without a lazy init (is_available(), device_count()): which module did it is
        # not known, so none of this batch is imported ahead again.
        state.skip += [m for m in warmed.imported if m not in state.skip]
        print(f"distci: importing {len(warmed.imported)} module(s) ahead ({', '.join(warmed.imported[:3])}, ...) "
              f"started {kind.name} in the rank template, which could then no longer fork ranks that use it; the "
              "template is replaced by a fresh one that leaves them to the tests that import them", flush=True)
        return True
    state.modules += [m for m in warmed.imported if m not in state.modules]
    if warmed.poisoned is None:
        return False
    state.skip.append(warmed.poisoned)
    print(f"distci: importing {warmed.poisoned} initialized {kind.name} in the rank template, which could then "
          f"no longer fork; the template is replaced by a fresh one that leaves it to the tests that import it",
          flush=True)
    return True


def _replace_template(args: argparse.Namespace, state: WarmState) -> None:
    """Becomes a fresh worker (exec: the same pid, keeper and channels to the controller)
    that imports what this one did, less the modules in `state.skip`."""
    argv = [a for a in args.argv]
    if "--replaced" in argv:
        del argv[argv.index("--replaced"):argv.index("--replaced") + 2]
    for fd in (args.fd, args.dump_fd):
        if fd >= 0:
            os.set_inheritable(fd, True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-u", "-m", "distci.harness.worker", *argv,
                              "--replaced", json.dumps(asdict(state))])


def _device_setup(args: argparse.Namespace) -> Callable[[], None]:
    """What a rank's process does before it joins its group: its device, the flight recorder."""

    def setup() -> None:
        kind = device_kind(args.device_type)
        if kind.name != "cpu":
            kind.device_module().set_device(args.rank)
        if args.dump_fd >= 0 and args.trace_dir:
            _serve_dumps(args.dump_fd, os.path.join(args.trace_dir, f"flight_recorder_rank{args.rank}.bin"))

    return setup


def run_on_rank(msg: object, ctx: DistContext) -> RankReport:
    """One test (or the start-up HealthCheck) on this rank, the log marking where it begins and ends."""
    if isinstance(msg, HealthCheck):
        return _health(ctx, msg)
    assert isinstance(msg, TestRequest)
    print(f"distci: ==== start {msg.nodeid} ====", flush=True)
    reseed(msg.seed)
    prepare_path(msg)
    report = execute(msg, ctx)
    print(f"distci: ==== end {msg.nodeid}: {report.outcome} ====", flush=True)
    return report


def _active_dispatch_modes() -> list[str]:
    """The TorchDispatchModes (FakeTensorMode, ...) still entered on this rank. A test that
    fails inside `with FakeTensorMode():` machinery can leave one active, and every later
    test on the rank then fails with "Please convert all Tensors to FakeTensors first"."""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    except ImportError:  # a torch without the helper
        return []
    try:
        return [type(mode).__name__ for mode in _get_current_dispatch_mode_stack()]
    except Exception:  # noqa: BLE001 - a private API that changed: no evidence either way
        return []


def _health(ctx: DistContext, check: HealthCheck) -> RankReport:
    """This rank's answer to a HealthCheck (see there); `info` carries what the controller
    compares across ranks: the process group's collective sequence number."""
    import torch
    import torch.distributed as dist

    start = time.monotonic()
    info: dict = {"device": str(ctx.device), "pid": os.getpid()}
    if ctx.device_type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(ctx.device)
    if not dist.is_initialized():
        return RankReport(ctx.rank, "failed", kind="exception", exc_type="ProcessGroupDestroyed",
                          message="the process group is destroyed", info=info)
    modes = _active_dispatch_modes()
    if modes:
        return RankReport(ctx.rank, "failed", kind="exception", exc_type="LeakedDispatchMode",
                          message=f"a dispatch mode is still active: {', '.join(modes)}", info=info)
    try:
        info["seq"] = int(dist.group.WORLD._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a backend without sequence numbers: the all-reduce decides
        info["seq"] = None
    if not check.collective:
        return RankReport(ctx.rank, "passed", info=info)
    t = torch.ones(1, device=ctx.device) * (ctx.rank + 1)
    expected = ctx.world_size * (ctx.world_size + 1) / 2
    try:
        work = dist.all_reduce(t, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=check.timeout_s))
        got = float(t.item())
    except Exception as exc:  # noqa: BLE001
        return RankReport(ctx.rank, "failed", kind="exception", exc_type=type(exc).__name__,
                          message=f"health all_reduce failed: {str(exc)[:300]}", info=info)
    if got != expected:
        return RankReport(ctx.rank, "failed", kind="exception", exc_type="HealthCheckError",
                          message=f"all_reduce gave {got}, expected {expected}", info=info)
    return RankReport(ctx.rank, "passed", duration_s=time.monotonic() - start, info=info)


def _requests(conn: Connection) -> Iterator[TestRequest]:
    """The tests the controller sends, until it says Shutdown or goes away."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if isinstance(msg, Shutdown):
            return
        if isinstance(msg, TestRequest):
            yield msg


def _send(conn: Connection, outcome: object) -> None:
    """An outcome to the controller; a broken channel (a test closed it in place) ends the
    worker with an exit code that says so."""
    try:
        conn.send(outcome)
    except OSError as exc:
        print(f"distci: the control channel to the controller broke: {exc}", flush=True)
        os._exit(CHANNEL_BROKEN_EXIT)


def _say_killed(left: list[int]) -> None:
    if left:
        print(f"distci: killed {len(left)} process(es) the test left running: {left}", flush=True)


def _serve_forked(args: argparse.Namespace, conn: Connection, state: WarmState) -> int:
    """The template's loop: each test in a fresh fork (template.py), forked once the modules
    its tests import are imported here (warm.py)."""
    template = Template(_rendezvous(args), args.fd, run_on_rank, _device_setup(args))
    learns = learns_imports(args.device_type)

    def import_ahead_or_replace(modules: list[str]) -> None:
        if _import_ahead(args, state, modules):
            template.drop_spare()
            template.kill_leftovers()
            _replace_template(args, state)

    # A template that does not learn is told what nearly every test imports lazily (warm.py);
    # the guard covers it like any module (one that poisons fork is skipped from then on). One
    # that learns imports what its stack's earlier sessions learned from the same test modules.
    # What importing a test module imports is remembered too: the pool's zygote imports it
    # for every rank at once in the stack's next session (zygote.py).
    record = record_path() if learns else None
    if learns:
        for module in list(state.modules):
            before = frozenset(sys.modules)
            import_ahead_or_replace([module])
            remember(record, module, newly_imported(before))
        import_ahead_or_replace(remembered(record, state.modules))
    else:
        import_ahead_or_replace([*OPTIMIZER_IMPORTS, *state.modules])
    if not state.serving:
        ready = template.start_up()
        learned = ready.info.pop("imported", []) if isinstance(ready, RankReport) else []
        if isinstance(ready, RankReport):
            ready.info["worker_pid"] = os.getpid()  # the forks' parent, under its keeper
        conn.send(ready)
        state.serving = True
        if learned and learns:  # what joining a group imports: for the forks after the first test's
            remember(record, JOINING, learned)
            import_ahead_or_replace(learned)
    for msg in _requests(conn):
        outcome = template.test(msg, conn)
        learned = outcome.info.pop("imported", []) if isinstance(outcome, RankReport) else []
        _send(conn, outcome)
        template.finish()
        _say_killed(template.kill_leftovers())
        if learned and learns:
            remember(record, msg.module, learned)
            import_ahead_or_replace(learned)
        template.fork_spare(msg.seq + 1)
    template.drop_spare()
    template.kill_leftovers()
    return 0


def _serve_in_place(args: argparse.Namespace, conn: Connection, state: WarmState) -> int:
    """`--in-place`: every test in this process, one process group, nothing reset (its
    modules imported first, as the template does: the comparison is of isolation alone)."""
    _add_path(state.sys_path)
    import_ahead(state.modules, lambda: False)
    _device_setup(args)()
    ctx, _store = join(_rendezvous(args), "in-place")
    ready = _health(ctx, HealthCheck())
    ready.info["worker_pid"] = os.getpid()
    conn.send(ready)
    for msg in _requests(conn):
        conn.send(Started(args.rank, os.getpid()))
        report = run_on_rank(msg, ctx)
        _say_killed(procs.kill_descendants(os.getpid()))
        _send(conn, report)
    try:
        import torch.distributed as dist

        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distci.harness.worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--device-type", required=True)
    parser.add_argument("--init-file", required=True)
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the controller")
    parser.add_argument("--dump-fd", type=int, default=-1, help="inherited socket: a byte asks for a flight-recorder dump")
    parser.add_argument("--pg-timeout", type=float, default=240.0)
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--trace-dir", default="")
    parser.add_argument("--in-place", action="store_true", help="run the tests in this process (no isolation)")
    parser.add_argument("--replaced", default=None, help="JSON WarmState of the template this process replaces")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)

    if args.replaced is None:  # a replacement stays under the keeper of the template it replaces
        procs.keep_tree(close_fds=tuple(fd for fd in (args.fd, args.dump_fd) if fd >= 0))
    _die_with_parent(os.getppid())
    # A rank is stopped by its controller, never by KeyboardInterrupt: a real SIGINT ends it
    # as a signal, and a KeyboardInterrupt raised by a test is that test's exception.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a SIGSEGV/SIGABRT leaves its Python stack in the rank log
    arm_stack_dumps()
    conn = Connection(args.fd)
    try:
        _warm_up(args)
        state = WarmState(**json.loads(args.replaced)) if args.replaced else _receive_warm(conn)
        if state is None:
            return 0
        serve = _serve_in_place if args.in_place else _serve_forked
        code = serve(args, conn, state)
    except BaseException as exc:  # noqa: BLE001 - start-up failure is infra, reported
        try:
            conn.send(RankReport(args.rank, "failed", kind="infra", exc_type=type(exc).__name__, message=str(exc)))
        except OSError:
            pass
        return 2
    # Nothing is left to flush or tear down (the tests ran in forks, the logs are unbuffered):
    # torch's interpreter teardown would only delay the controller's shutdown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
