"""A rank worker: one long-lived process per rank, serving tests from the controller.

Started by RankPool with `python -m distci.harness.worker`. It joins the process group
once, then loops: receive a TestRequest, isolate, run it, send a RankReport. It dies
with its controller (PR_SET_PDEATHSIG and a parent watchdog) so no rank outlives a
pytest session, even one killed with SIGKILL.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection

from distci.harness import isolation, leaks, procs
from distci.harness.context import DistContext
from distci.harness.devices import device_kind
from distci.harness.execute import execute, prepare_path
from distci.harness.protocol import CHANNEL_BROKEN_EXIT, HealthCheck, RankReport, Shutdown, TestRequest


def _die_with_parent(parent_pid: int) -> None:
    """The kernel kills this rank when the controller dies; as a rank is a subreaper, what
    its tests start (and leave orphaned) stays under it, where the pool can find it."""
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


def _run_test(msg: TestRequest, ctx: DistContext, saved: dict) -> RankReport:
    """One test, isolated: reset before, leak check after (its findings in `info["leaks"]`)."""
    if msg.isolate:
        isolation.reset(saved, msg.seed)
    arm_stack_dumps()
    prepare_path(msg)
    before: list[leaks.Snapshot] = []

    def take_snapshot() -> None:
        module = sys.modules.get(msg.module)
        before.append(leaks.snapshot(getattr(module, "__file__", "") or ""))

    report = execute(msg, ctx, take_snapshot if msg.isolate else None)
    if msg.isolate:  # at once, so the health check after the test sees a clean process too
        isolation.restore_globals(saved.get("globals", {}))
        if before:
            found = leaks.check(before[0])
            if found:
                report.info["leaks"] = [leak.to_dict() for leak in found]
                print(f"distci: the test left: {'; '.join(leak.what for leak in found)}", flush=True)
    return report


def _init(args: argparse.Namespace) -> DistContext:
    import torch
    import torch.distributed as dist

    kind = device_kind(args.device_type)
    if kind.name == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world_size))
    else:
        kind.device_module().set_device(args.rank)
    # All ranks meet at the store first, with the start-up's patience; the process group
    # (whose timeout may be a short test's few seconds) is created only once all are up.
    store = dist.FileStore(args.init_file, args.world_size)
    store.set_timeout(datetime.timedelta(seconds=args.start_timeout))
    store.set(f"distci_up_{args.rank}", "1")
    store.wait([f"distci_up_{r}" for r in range(args.world_size)])
    dist.init_process_group(
        kind.backend,
        store=store,
        rank=args.rank,
        world_size=args.world_size,
        timeout=datetime.timedelta(seconds=args.pg_timeout),
    )
    return DistContext(
        rank=args.rank,
        world_size=args.world_size,
        device_type=kind.name,
        backend=kind.backend,
        local_rank=args.rank,
        group=dist.group.WORLD,
    )


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
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--trace-dir", default="")
    args = parser.parse_args(argv)

    _die_with_parent(args.parent_pid)
    # A rank is stopped by its controller, never by KeyboardInterrupt: a real SIGINT ends it
    # as a signal, and a KeyboardInterrupt raised by a test is that test's exception.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a SIGSEGV/SIGABRT leaves its Python stack in the rank log
    arm_stack_dumps()
    conn = Connection(args.fd)
    if args.dump_fd >= 0 and args.trace_dir:
        _serve_dumps(args.dump_fd, os.path.join(args.trace_dir, f"flight_recorder_rank{args.rank}.bin"))

    try:
        ctx = _init(args)
        # Before the ranks report ready: snapshot() imports Dynamo and its configs, seconds
        # of start-up that would otherwise be charged to the first test's timeout.
        saved = isolation.snapshot()
        import torch._dynamo  # noqa: F401 - reset() uses it before every test

        conn.send(_health(ctx, HealthCheck()))
    except BaseException as exc:  # noqa: BLE001 - start-up failure is infra, reported
        conn.send(RankReport(args.rank, "failed", kind="infra", exc_type=type(exc).__name__, message=str(exc)))
        return 2

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if isinstance(msg, Shutdown):
            break
        if isinstance(msg, HealthCheck):
            conn.send(_health(ctx, msg))
            continue
        if isinstance(msg, TestRequest):
            print(f"distci: ==== start {msg.nodeid} ====", flush=True)
            before = set(procs.descendants(os.getpid()))
            report = _run_test(msg, ctx, saved)
            left = procs.kill_descendants(os.getpid(), keep=before)
            if left:
                print(f"distci: killed {len(left)} process(es) the test left running: {left}", flush=True)
            print(f"distci: ==== end {msg.nodeid}: {report.outcome} ====", flush=True)
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                conn.send(report)
            except OSError as exc:  # the channel broke (a test closed it): say so by the exit code
                print(f"distci: the control channel to the controller broke: {exc}", flush=True)
                os._exit(CHANNEL_BROKEN_EXIT)
    try:
        import torch.distributed as dist

        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
