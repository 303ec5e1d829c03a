"""A pipeline schedule's first step runs every stage's forward once more than it has microbatches (2 ranks).

Trigger: a PipelineStage built without input shapes (torchtitan's `_pipeline_module_split`,
the pipelining tutorial) infers them at the schedule's first `step`, by running the stage's
forward on real data in training mode. Whatever a forward changes changes once more on that
step: a buffer counting tokens (torchtitan's MoE `tokens_per_expert`, which the load-balancing
bias is then updated from), spectral_norm's power-iteration vectors, BatchNorm's running
statistics. torch 2.13.0 (CPU, gloo, 2026-12-07) counts 3 forwards for 2 microbatches on the
first step; 2.15.0 counts 2 (2.14 not measured). No upstream issue found
(reports/upstream-pp-shape-inference-forward.md). Found by the models generator's
`pp-spectral_norm-mb1` and `pp-moe4-...-lb_bias-steps2` structures. The control is the
second step: once the shapes are known, one forward per microbatch.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
MICROBATCHES = 2


class Counting(torch.nn.Module):
    """A linear layer that counts its training forwards in a buffer (as a token counter does)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("forwards", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.forwards += 1
        return self.lin(x)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("step", [0, 1], ids=["first_step", "second_step"])
def test_a_step_runs_each_stage_once_per_microbatch(dist, step: int) -> None:
    import torch.distributed as tdist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if dist.group is None:
        dist.init()
    rank = tdist.get_rank()
    module = Counting()
    stage = PipelineStage(module, rank, 2, dist.device)
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=torch.nn.functional.mse_loss)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(step + 1):
        before = int(module.forwards)
        schedule.step(*((x,) if rank == 0 else ()), **({"target": y} if rank == 1 else {}))
    ran = int(module.forwards) - before
    assert ran == MICROBATCHES, f"stage {rank}: {ran} training forwards in a step of {MICROBATCHES} microbatches"
