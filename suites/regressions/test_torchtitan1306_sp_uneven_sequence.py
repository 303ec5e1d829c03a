"""pytorch/torchtitan#1306: sequence parallelism on a sequence length the TP degree does not divide.

torchtitan's plan returns the embedding's Shard(1) output as a plain tensor
(RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)), use_local_output=True
by default); the SequenceParallel norm after it rebuilds a DTensor with
`DTensor.from_local(..., Shard(1))` and no shape, so each rank infers the global length as its
own shard x the TP degree (3 on 2 ranks: 4 on rank 0, 2 on rank 1; 1 on 2 ranks: 2 and 0).
The next layer's all-gather to Replicate then moves different sizes on different ranks: gloo
aborts the rank ("Received data size doesn't match expected size"), and the empty shard of a
length-1 sequence fails in the view strategy ("integer modulo by zero"). torchtitan asserts
seq_len % tp == 0 (pytorch/torchtitan#1312); a loop with dynamic padding or an eval batch
feeding the same plan meets it. Found by the models generator's seq feature (plan=titan,
seq=odd / one) on torch 2.13.0, CPU, 2026-12-07.
Control: the embedding's output kept a DTensor (use_local_output=False, the proposal of
pytorch/torchtitan#686), whose global length is known, passes; so does an even length.
Pass means the sharded layers' output equals the unsharded ones'.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
VOCAB, DIM = 8, 4


@pytest.mark.world_size(2)
@pytest.mark.parametrize("seq", [3, 1, 4])
@pytest.mark.parametrize("embedding_output", ["local", "dtensor"])
def test_sequence_parallel_norm_on_a_sequence_tp_does_not_divide(dist, embedding_output: str, seq: int) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, DIM), nn.LayerNorm(DIM), nn.Linear(DIM, DIM, bias=False))
    model = model.to(dist.device)
    sharded = copy.deepcopy(model)
    parallelize_module(sharded, dist.mesh(), {
        "0": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                             use_local_output=embedding_output == "local"),
        "1": SequenceParallel(),
        "2": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    tokens = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(1)).to(dist.device)
    out = sharded(tokens)
    out = out.full_tensor() if hasattr(out, "full_tensor") else out
    torch.testing.assert_close(out, model(tokens))
