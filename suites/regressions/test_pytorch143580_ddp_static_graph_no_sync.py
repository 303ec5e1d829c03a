"""DistributedDataParallel(static_graph=True) with gradient accumulation under no_sync() (2 ranks).

Trigger: a DDP model with static_graph=True (the documented pairing with activation
checkpointing) whose first training step accumulates: the first microbatch's backward
runs under `no_sync()`, the last one synchronizes. torch 2.13.0 (CPU, gloo, 2026-12-04)
raises in that first no_sync backward: "expect_autograd_hooks_ INTERNAL ASSERT FAILED at
.../reducer.cpp", because the static-graph first-iteration delay_all_reduce is queued on a
backward that expects no hooks (pytorch/pytorch#143580; the open fix, #187732, says that
once unblocked the reducer also stops all-reducing from the second step on, which the
comparison below would see). Found by suites/test_scenarios.py's `ddp-eager-ac_full-ga2`.
The control is static_graph=False: the same steps, accumulated then averaged.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
STEPS = 2
MICROBATCHES = 2


@pytest.mark.world_size(2)
@pytest.mark.parametrize("static_graph", [True, False], ids=["static_graph", "dynamic_graph"])
def test_no_sync_accumulation_averages_the_gradients(dist, static_graph: bool) -> None:
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(dist.device)
    ddp = DistributedDataParallel(model, static_graph=static_graph)
    gen = torch.Generator().manual_seed(1 + dist.rank)
    for _ in range(STEPS):
        model.zero_grad(set_to_none=True)
        for micro in range(MICROBATCHES):
            x = torch.randn(4, 8, generator=gen).to(dist.device)
            if micro < MICROBATCHES - 1:
                with ddp.no_sync():
                    ddp(x).sum().backward()
            else:
                ddp(x).sum().backward()
        for p in model.parameters():  # synchronized: every rank holds the same average
            mine = p.grad.detach().clone()
            every = [torch.empty_like(mine) for _ in range(dist.world_size)]
            tdist.all_gather(every, mine)
            assert all(torch.equal(mine, other) for other in every), "ranks' gradients differ after the sync"
