"""A zero-bubble schedule over FSDP2 stages with a unit inside the stage (4 ranks, 4 stages).

Trigger: torchtitan's PP x FSDP2 layout, a 2x2 ("pp", "dp_shard") mesh whose stage modules
are `fully_shard`ed block by block, then as a whole (parallelize_llama's apply_fsdp on every
stage). The zero-bubble schedules split each stage's backward into an input pass
(`stage_backward_input`) and a weight pass (`stage_backward_weight`); pytorch#134052 calls
the stage root's FSDP2 post-backward after the weight pass, but a block's own unit runs its
post-backward (reduce-scatter, reshard) in the input pass, before its weights have their
gradient: the block's weights end the step with no gradient, or a wrong one (torch 2.13.0
and 2.15.0, CPU, gloo, 2026-12-07; ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble;
ScheduleDualPipeV on its last stage, found by the models generator's mesh-forms run).
The same stages under Interleaved1F1B, and the zero-bubble schedules with the stage root as
the only unit, train right: the controls. No upstream issue found
(reports/upstream-pp-zero-bubble-fsdp-nested-units.md). Found by the models generator's
`pp_fsdp-*-zbv` / `-zero_bubble` structures.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
ROWS, DIM, STAGES = 8, 4, 4


@pytest.mark.world_size(4)
@pytest.mark.parametrize("units", ["block", "root"])
@pytest.mark.parametrize("schedule", ["ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble",
                                      "ScheduleDualPipeV", "ScheduleInterleaved1F1B"])
def test_fsdp_stages_under_a_schedule_get_the_full_batch_gradient(dist, schedule: str, units: str) -> None:
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, schedules

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard

    if dist.group is None:
        dist.init()
    mesh = init_device_mesh(dist.device_type, (2, 2), mesh_dim_names=("pp", "dp_shard"))
    torch.manual_seed(0)
    full = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(DIM, DIM)) for _ in range(STAGES)])
    x, y = torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)
    rank, shard = mesh["pp"].get_local_rank(), mesh["dp_shard"].get_local_rank()
    v_shaped = schedule in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")
    mine = [rank, STAGES - 1 - rank] if v_shaped else [rank, rank + 2]
    parts = {s: copy.deepcopy(full[s]) for s in mine}
    for part in parts.values():
        if units == "block":
            fully_shard(part[0], mesh=mesh["dp_shard"])
        fully_shard(part, mesh=mesh["dp_shard"])
    stages = [PipelineStage(parts[s], s, STAGES, dist.device, group=mesh["pp"].get_group()) for s in mine]
    if not hasattr(schedules, schedule):
        pytest.skip(f"this torch's pipelining has no {schedule}")
    # DualPipeV takes no fewer microbatches than stages
    microbatches = STAGES if schedule == "ScheduleDualPipeV" else 2
    runner = getattr(schedules, schedule)(stages, n_microbatches=microbatches, loss_fn=torch.nn.functional.mse_loss)
    xs, ys = x.chunk(2)[shard], y.chunk(2)[shard]  # each pipeline its own rows
    runner.step(*((xs,) if 0 in mine else ()), **({"target": ys} if STAGES - 1 in mine else {}))
    torch.nn.functional.mse_loss(full(x), y).backward()
    for s in mine:
        for (name, got), want in zip(parts[s].named_parameters(), full[s].parameters()):
            assert got.grad is not None, f"stage {s} of {schedule}: {name} has no gradient"
            assert torch.allclose(got.grad.full_tensor(), want.grad, rtol=1e-4, atol=1e-6), (
                f"stage {s} of {schedule}: {name}'s gradient is not the full batch's")
    tdist.barrier()
