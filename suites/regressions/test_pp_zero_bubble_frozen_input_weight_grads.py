"""A zero-bubble schedule's stage whose input does not require grad (2 ranks, 4 stages).

Trigger: a frozen first stage (a frozen token embedding, HF's
`get_input_embeddings().requires_grad_(False)`; LoRA freezing every base weight) sends
an activation that does not require grad. The zero-bubble schedules split each stage's
backward into an input pass (dI, `stage_backward_input`) and a weight pass (dW,
`stage_backward_weight`, from what dI kept). With no input to differentiate, the next
stage's weight pass leaves its trainable weights without a gradient: they never train
(torch 2.13.0 and 2.15.0, CPU, gloo, 2026-12-07; ScheduleInterleavedZeroBubble and
ScheduleZBVZeroBubble). Interleaved1F1B, with a whole backward per stage, gives them their
gradient: the control. No upstream issue found (reports/upstream-pp-zero-bubble-frozen-input.md).
Found by the models generator's `pp-*frozen_*-zero_bubble` / `-zbv` structures.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
ROWS, DIM, STAGES = 4, 4, 4


@pytest.mark.world_size(2)
@pytest.mark.parametrize("schedule", ["ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble",
                                      "ScheduleInterleaved1F1B"])
def test_a_trainable_stage_after_a_frozen_one_gets_its_gradient(dist, schedule: str) -> None:
    import torch.distributed as tdist
    from torch.distributed.pipelining import PipelineStage, schedules

    if dist.group is None:
        dist.init()
    torch.manual_seed(0)
    full = torch.nn.Sequential(*[torch.nn.Linear(DIM, DIM) for _ in range(STAGES)])
    full[0].requires_grad_(False)  # the frozen first stage
    x, y = torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)
    rank = tdist.get_rank()
    mine = [rank, STAGES - 1 - rank] if schedule == "ScheduleZBVZeroBubble" else [rank, rank + 2]
    parts = {s: copy.deepcopy(full[s]) for s in mine}
    stages = [PipelineStage(parts[s], s, STAGES, dist.device) for s in mine]
    runner = getattr(schedules, schedule)(stages, n_microbatches=2, loss_fn=torch.nn.functional.mse_loss)
    runner.step(*((x,) if 0 in mine else ()), **({"target": y} if STAGES - 1 in mine else {}))
    torch.nn.functional.mse_loss(full(x), y).backward()
    for s in mine:
        for got, want in zip(parts[s].parameters(), full[s].parameters()):
            if want.requires_grad:
                assert got.grad is not None, f"stage {s} of {schedule}: a trainable weight has no gradient"
                assert torch.allclose(got.grad, want.grad, rtol=1e-4, atol=1e-6)
