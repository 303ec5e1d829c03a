"""pytorch#150336: a TP feed-forward whose hidden width the TP degree does not divide.

ColwiseParallel (use_local_output=True, the default) hands its uneven output shard to
the next layer as a plain tensor; RowwiseParallel turns it back into a DTensor with
`DTensor.from_local(..., Shard(-1))` without a shape, so each rank infers the global
width as its own shard x the TP degree (a hidden width of 5 on 2 ranks: 6 on rank 0, 4
on rank 1) and the matmul refuses: "a and b must have same reduction dim, but got
[N, 6] X [5, N]". Found by suites/test_scenarios.py's `tp*-uneven` rows (hidden 255 on 2
ranks) on torch 2.13.0, CPU, 2026-12-04; those rows now keep the hidden width even under TP
(scenario_record.Scenario.model_args) and shard the vocabulary unevenly only.
Control: the same layers with the colwise output kept a DTensor (use_local_output=False,
torchtitan's choice for wq/wk/wv), whose global shape is known, pass.
Pass means the sharded feed-forward's output equals the unsharded one's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
DIM, HIDDEN, ROWS = 8, 5, 4


@pytest.mark.world_size(2)
@pytest.mark.parametrize("colwise_output", ["local", "dtensor"])
def test_uneven_hidden_width_between_colwise_and_rowwise(dist, colwise_output: str) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    gen = torch.Generator().manual_seed(0)
    ffn = nn.Sequential(nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(HIDDEN, DIM, bias=False))
    with torch.no_grad():
        for p in ffn.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    ffn = ffn.to(dist.device)
    sharded = copy.deepcopy(ffn)
    parallelize_module(sharded, dist.mesh(), {
        "0": ColwiseParallel(use_local_output=colwise_output == "local"),
        "1": RowwiseParallel(),
    })
    x = torch.randn(ROWS, DIM, generator=gen).to(dist.device)
    out = sharded(x)
    out = out.full_tensor() if hasattr(out, "full_tensor") else out
    torch.testing.assert_close(out, ffn(x))
