"""The program torchrun starts on every rank in torchrun mode."""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
from pathlib import Path

from .context import DistContext
from .devices import device_kind
from .execute import execute


def main() -> int:
    req_file = Path(sys.argv[1])
    with open(req_file, "rb") as fh:
        spec = pickle.load(fh)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    (req_file.parent / f"rank{rank}.pid").write_text(str(os.getpid()))
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    kind = device_kind(spec["device_type"])
    ctx = DistContext(rank, int(os.environ["WORLD_SIZE"]), kind.name, kind.backend, local_rank)
    if kind.name != "cpu":
        kind.device_module().set_device(local_rank)
    else:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.world_size))
    if not spec["owns_pg"]:
        ctx.init()
    report = execute(spec["request"], ctx)
    tmp = req_file.parent / f"rank{rank}.report.tmp"
    with open(tmp, "wb") as fh:
        pickle.dump(report, fh)
    tmp.rename(req_file.parent / f"rank{rank}.report.pkl")
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
