"""2 gloo ranks: the ops sweep's in-step check (suites/generators/ops_entry.py `_in_step`) after a
case that left a collective issued on one rank only.

Run by tests/test_fuzz_ops.py. First the sweep's agreed clock (`_agreed_clock`) must read the
same on both ranks though rank 1 reads it later. Then each rank builds a 1-D mesh as a case does, runs the check once
in step (it must say in step), then rank 0 issues one all_reduce on the mesh's group that rank
1 never issues, as a rank that raised after DTensor issued a collective leaves it, and runs the
check again: it must say out of step on both ranks, and at once (counting the collectives each
rank issued), not after the barriers' `hang_s`. Prints "in step: True, then False in N s" per
rank and exits 0, or exits 1 naming what differed. The ranks are forked from this process,
which imported torch and the sweep's module once for both (and ran no op before the fork).
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
HANG_S = 60.0
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Ranks:
    """What `_in_step` reads of the harness's `dist` fixture: the world size and the cached meshes."""
    world_size: int
    _meshes: dict = field(default_factory=dict)


def rank_main(rank: int, init: str, failed) -> None:
    from suites.generators.ops_entry import _agreed_clock, _in_step, _modes
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    side = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=HANG_S))
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
    ranks = Ranks(WORLD, {"tp": mesh})
    modes = _modes()
    now = _agreed_clock(side)
    if rank == 1:
        time.sleep(0.3)  # its own clock is later: the reading must still be rank 0's
    readings: list = [None] * WORLD
    dist.all_gather_object(readings, now(), group=side)
    if readings[0] != readings[1]:
        print(f"rank {rank}: the agreed clock read {readings} on the two ranks", flush=True)
        failed.value = 1
    dist.all_reduce(torch.ones(2), group=mesh.get_group(0))
    first = _in_step(ranks, side, HANG_S, modes)
    if rank == 0:
        dist.all_reduce(torch.ones(2), group=mesh.get_group(0), async_op=True)  # its peer never issues it
    began = time.monotonic()
    second = _in_step(ranks, side, HANG_S, modes)
    took = time.monotonic() - began
    print(f"rank {rank}: in step: {first}, then {second} in {took:.1f} s", flush=True)
    if not first or second or took > HANG_S / 3:
        failed.value = 1
    os._exit(0)  # the world group is out of step by design: no orderly teardown


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        import suites.generators.ops_entry  # noqa: F401 - imported once, before the ranks are forked

        failed = mp.get_context("fork").Value("i", 0)
        mp.start_processes(rank_main, args=(f"file://{tmp}/store", failed), nprocs=WORLD, join=True,
                           start_method="fork")
        return int(failed.value)


if __name__ == "__main__":
    sys.exit(main())
