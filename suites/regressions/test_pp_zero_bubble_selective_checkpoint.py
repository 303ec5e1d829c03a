"""A zero-bubble schedule over a stage under op-level selective activation checkpointing (2 ranks).

Trigger: torchtitan's selective AC (`create_selective_checkpoint_contexts`, matmul outputs
saved, the rest recomputed) around a stage's block, with a schedule that splits backward
into an input pass and a weight pass (ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble).
The weight pass runs backward through the checkpointed region a second time, and SAC
(whose saved matmul outputs may be used by one backward only) refuses: "Trying to backward an extra time. You are only allowed to backward once on any
region computed under selective activation checkpoint." (torch 2.13.0 and 2.15.0, CPU, gloo,
2026-12-07). AReaL turns selective AC off for V-style schedules for this reason
(areal-project/AReaL#916); no torch issue found (reports/upstream-pp-zero-bubble-sac.md).
Found by the models generator's `pp-*ac_selective*-zbv` structures. The control is full AC
(checkpoint_wrapper without a context_fn): the same schedule trains.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
ROWS, DIM, STAGES = 4, 4, 4


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # no bias: the projections are aten.mm, the op the policy saves (a bias makes them addmm)
        self.w1, self.w2 = torch.nn.Linear(DIM, 2 * DIM, bias=False), torch.nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.nn.functional.silu(self.w1(x)))


def _checkpointed(block: torch.nn.Module, ac: str) -> torch.nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    kwargs = {"context_fn": functools.partial(create_selective_checkpoint_contexts, policy)} if ac == "selective" else {}
    return checkpoint_wrapper(block, preserve_rng_state=False, **kwargs)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("ac", ["selective", "full"])
def test_a_checkpointed_stage_trains_under_zero_bubble(dist, ac: str) -> None:
    import torch.distributed as tdist
    from torch.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble

    if dist.group is None:
        dist.init()
    torch.manual_seed(0)
    full = torch.nn.Sequential(*[Block() for _ in range(STAGES)])
    x, y = torch.randn(ROWS, 2, DIM), torch.randn(ROWS, 2, DIM)
    rank = tdist.get_rank()
    mine = [rank, STAGES - 1 - rank]
    parts = {s: _checkpointed(copy.deepcopy(full[s]), ac) for s in mine}
    stages = [PipelineStage(parts[s], s, STAGES, dist.device) for s in mine]
    runner = ScheduleZBVZeroBubble(stages, n_microbatches=2, loss_fn=torch.nn.functional.mse_loss)
    runner.step(x, target=y) if rank == 0 else runner.step()
    torch.nn.functional.mse_loss(full(x), y).backward()
    for s in mine:
        for got, want in zip(parts[s].parameters(), full[s].parameters()):
            assert got.grad is not None and torch.allclose(got.grad, want.grad, rtol=1e-4, atol=1e-6)
