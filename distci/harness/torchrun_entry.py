"""The program torchrun starts on every rank in torchrun mode.

Like a pool rank it dies with its parent (the torchrun agent), adopts what its test
leaves orphaned, writes its own log and its Python stack on a fatal signal, and, having
finished its test, stays until every peer has reported (or the test's time is up): a
rank that leaves early would turn a peer's hang into a "peer vanished" error.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import time
from pathlib import Path

from distci.harness import procs
from distci.harness.context import DistContext
from distci.harness.devices import device_kind
from distci.harness.execute import execute


def _own_log(log_dir: str, rank: int) -> None:
    """stdout and stderr (and so faulthandler) go to this rank's own log file."""
    fd = os.open(os.path.join(log_dir, f"torchrun-rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _await_peers(work: Path, world_size: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if all((work / f"rank{r}.report.pkl").exists() for r in range(world_size)):
            return
        time.sleep(0.1)


PEER_GRACE_S = 30.0  # past the test's timeout: by then the controller has judged and killed the launch


def main() -> int:
    req_file = Path(sys.argv[1])
    with open(req_file, "rb") as fh:
        spec = pickle.load(fh)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    procs.die_with_parent()
    procs.become_subreaper()
    if spec.get("log_dir"):
        _own_log(spec["log_dir"], rank)
    print(f"distci: ==== start {spec['request'].nodeid} (rank {rank}) ====", flush=True)
    (req_file.parent / f"rank{rank}.pid").write_text(str(os.getpid()))
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    kind = device_kind(spec["device_type"])
    world_size = int(os.environ["WORLD_SIZE"])
    ctx = DistContext(rank, world_size, kind.name, kind.backend, local_rank)
    if kind.name != "cpu":
        kind.device_module().set_device(local_rank)
    else:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.world_size))
    if not spec["owns_pg"]:
        ctx.init(spec.get("pg_timeout_s"))
    start = time.monotonic()
    (req_file.parent / f"rank{rank}.ready").write_text("")  # the test's time starts now (as in the pool)
    report = execute(spec["request"], ctx)
    tmp = req_file.parent / f"rank{rank}.report.tmp"
    with open(tmp, "wb") as fh:
        pickle.dump(report, fh)
    tmp.rename(req_file.parent / f"rank{rank}.report.pkl")
    print(f"distci: ==== end {spec['request'].nodeid}: {report.outcome} (rank {rank}) ====", flush=True)
    _await_peers(req_file.parent, world_size, start + float(spec.get("timeout_s") or 0) + PEER_GRACE_S)
    procs.kill_descendants(os.getpid())
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
