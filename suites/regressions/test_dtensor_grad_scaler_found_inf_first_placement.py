"""GradScaler's inf check over DTensor gradients agrees across ranks only as the FIRST gradient's
placements say (2 ranks).

Trigger: torch.amp.GradScaler.unscale_ hands every gradient of a device and dtype to one
`_amp_foreach_non_finite_check_and_unscale_`; DTensor's handler for it (found_inf_reduce_handler,
pytorch PR #132816) reduces `found_inf` over the mesh axes where the list's first gradient is
not Replicate, and over no axis where it is. An optimizer whose first parameter is replicated
(a norm TP leaves replicated: torchtitan's SequenceParallel norms, FSDP2 over TP's
(Shard(0), Replicate()) norms on the tp axis) and a later one sharded with an inf in one rank's
shard only: that rank finds the inf and skips the step, the others step, and the ranks' models
differ from then on, silently. torch 2.13.0 and 2.15.0, CPU, gloo. The control (the sharded
gradient first) skips on every rank. Found while reading the handler for the programs
generator's loss-scaling round (issue 40); the generator's spike overflows every shard, so it
does not reach this face (reports/fuzz-programs-2026-12-08-amp.md).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("first", ["replicate", "shard"])
def test_every_rank_skips_when_one_shard_overflows(dist, first: str) -> None:
    import torch.distributed as tdist
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = dist.mesh()
    kinds = ["replicate", "shard"] if first == "replicate" else ["shard", "replicate"]
    params = {}
    for kind in kinds:
        placement = Replicate() if kind == "replicate" else Shard(0)
        params[kind] = torch.nn.Parameter(distribute_tensor(torch.ones(4, 4, device=dist.device), mesh, [placement]))
        params[kind].grad = distribute_tensor(torch.ones(4, 4, device=dist.device), mesh, [placement])
    if tdist.get_rank() == 1:  # an overflow in rank 1's shard of the sharded gradient alone
        params["shard"].grad._local_tensor[0, 0] = float("inf")
    opt = torch.optim.SGD(list(params.values()), lr=0.1)
    scaler = torch.amp.GradScaler(dist.device_type, init_scale=2.0)
    scaler.scale(torch.ones((), device=dist.device))
    scaler.step(opt)
    scaler.update()
    scales = [None] * tdist.get_world_size()
    tdist.all_gather_object(scales, scaler.get_scale())
    # the full gradient holds an inf: every rank skips the step and backs its scale off to 1.0
    assert scales == [1.0] * len(scales), f"scale after the step by rank: {scales} (a rank that stepped: 2.0)"
