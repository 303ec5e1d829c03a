"""A pipeline schedule stepped on batches of another sequence length than its first (2 ranks).

Trigger: the first `schedule.step` infers each stage's input and output shapes (shape
inference) and sizes its send and receive buffers from them; a later step whose batch is
another length (HF Trainer's dynamic padding, group_by_length, any per-batch length) sends a
tensor of the new size into a buffer of the old one. On gloo the receiving rank aborts
("Received data size doesn't match expected size. 768 vs 384"); nothing checks the shape
first. PipelineStage does not support per-step input shapes (pytorch/torchtitan#431, the
maintainers' answer; the feature request pytorch/pytorch#159942 is open); torchtitan's data is
packed to one seq_len. Found by the models generator's seq=varied structures under pp,
pp_fsdp and pp_tp on torch 2.13.0 (CPU, gloo, fixes off, 2026-12-07). The control steps
twice on one length.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
ROWS, DIM, VOCAB = 2, 4, 8


@pytest.mark.world_size(2)
@pytest.mark.parametrize("lengths", [(2, 3), (2, 2)], ids=["per_step", "one_length"])
def test_a_later_step_may_feed_another_sequence_length(dist, lengths: tuple[int, int]) -> None:
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if dist.group is None:
        dist.init()
    torch.manual_seed(0)
    full = torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, VOCAB))

    def loss_fn(logits, target):
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())

    stage = PipelineStage(full[tdist.get_rank()], tdist.get_rank(), 2, dist.device)
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=loss_fn)
    for seq in lengths:
        tokens, labels = torch.randint(0, VOCAB, (ROWS, seq)), torch.randint(0, VOCAB, (ROWS, seq))
        losses: list[torch.Tensor] = []
        schedule.step(*((tokens,) if tdist.get_rank() == 0 else ()),
                      **({"target": labels, "losses": losses} if tdist.get_rank() == 1 else {}))
        if tdist.get_rank() == 1:
            expected = [loss_fn(full(x), y) for x, y in zip(tokens.tensor_split(2), labels.tensor_split(2))]
            assert torch.allclose(torch.stack(losses), torch.stack(expected).detach(), rtol=1e-5)
