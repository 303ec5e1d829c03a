"""A pipeline schedule over a batch its microbatch count does not divide (2 ranks).

Trigger: `schedule.step(x, target=y)` splits the batch with `torch.tensor_split`, so 4 rows
in 3 microbatches are chunks of 2, 1 and 1 rows, and the API accepts that. The stage after
the first sizes its receive buffer from the first microbatch and reuses it, so the last
stage's output for the 1-row microbatches still has 2 rows and the loss raises "Expected
input batch_size (8) to match target batch_size (4)" (torch 2.13.0 and 2.15.0, CPU, gloo,
2026-12-07): pytorch/pytorch#126600 (closed, the symptom unchanged). torchtitan asks for a
batch its microbatch size divides; the pipelining tutorial's API does not. Found by the
models generator's `pp-mb3` structures (suites/generators/models_entry.py). The control is
2 microbatches: the same 4 rows, even chunks.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
ROWS, SEQ, DIM, VOCAB = 4, 2, 4, 8


@pytest.mark.world_size(2)
@pytest.mark.parametrize("microbatches", [3, 2], ids=["uneven", "even"])
def test_every_microbatch_reaches_the_loss_with_its_own_rows(dist, microbatches: int) -> None:
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if dist.group is None:
        dist.init()
    torch.manual_seed(0)
    full = torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, VOCAB))
    tokens, labels = torch.randint(0, VOCAB, (ROWS, SEQ)), torch.randint(0, VOCAB, (ROWS, SEQ))

    def loss_fn(logits, target):
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())

    stage = PipelineStage(full[tdist.get_rank()], tdist.get_rank(), 2, dist.device)
    schedule = ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=loss_fn)
    losses: list[torch.Tensor] = []
    schedule.step(*((tokens,) if tdist.get_rank() == 0 else ()),
                  **({"target": labels, "losses": losses} if tdist.get_rank() == 1 else {}))
    if tdist.get_rank() == 1:
        expected = [loss_fn(full(x), y) for x, y in zip(tokens.tensor_split(microbatches),
                                                         labels.tensor_split(microbatches))]
        assert torch.allclose(torch.stack(losses), torch.stack(expected).detach(), rtol=1e-5)
