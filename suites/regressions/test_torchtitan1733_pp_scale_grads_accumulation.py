"""Gradient accumulation over pipeline schedule steps with `scale_grads=True` (2 ranks).

Trigger: a trainer accumulating gradients calls `schedule.step` once per accumulation
microbatch (torchtitan's train step) with the schedule's default `scale_grads=True`. At
the end of every step the stage divides EVERY gradient by the microbatch count
(`stage.scale_grads`), the ones earlier steps accumulated included, so after two steps the
first step's share is divided twice: the accumulated gradient is a moving average, not a
sum (torch 2.13.0 and 2.15.0, CPU, gloo, 2026-12-07). pytorch/torchtitan#1733 (torchtitan
switched to `scale_grads=False` and a loss scaled by the step's token count, #1732); the
schedule's own fix is open (pytorch/pytorch#196641). Found by the models generator's
`pp-ga2` structures. The control is `scale_grads=False` with the loss divided by the
microbatch count: the same gradients, summed once.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
ROWS, DIM, MICROBATCHES, ACCUMULATION = 4, 4, 2, 2


@pytest.mark.world_size(2)
@pytest.mark.parametrize("scale_grads", [True, False], ids=["scale_grads", "loss_scaled"])
def test_accumulated_steps_sum_their_gradients(dist, scale_grads: bool) -> None:
    import torch.distributed as tdist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if dist.group is None:
        dist.init()
    torch.manual_seed(0)
    full = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.Linear(DIM, 1))
    batches = [(torch.randn(ROWS, DIM), torch.randn(ROWS, 1)) for _ in range(ACCUMULATION)]

    def loss_fn(out, target):
        loss = torch.nn.functional.mse_loss(out, target) / ACCUMULATION
        return loss if scale_grads else loss / MICROBATCHES

    rank = tdist.get_rank()
    part = torch.nn.Sequential(*[m for m in __import__("copy").deepcopy(full)][rank:rank + 1])
    stage = PipelineStage(part, rank, 2, dist.device)
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn, scale_grads=scale_grads)
    for x, y in batches:
        schedule.step(*((x,) if rank == 0 else ()), **({"target": y} if rank == 1 else {}))
    for x, y in batches:  # the reference: each batch's mean loss, accumulated
        (torch.nn.functional.mse_loss(full(x), y) / ACCUMULATION).backward()
    for got, want in zip(part.parameters(), full[rank].parameters()):
        assert torch.allclose(got.grad, want.grad, rtol=1e-4, atol=1e-6), (
            f"stage {rank}: the accumulated gradient is not the reference's sum "
            f"(max |diff| {float((got.grad - want.grad).abs().max()):.3g})")
