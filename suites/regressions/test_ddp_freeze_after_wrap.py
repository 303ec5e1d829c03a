"""DDP: a module frozen after DistributedDataParallel wrapped the model silently leaves the
other parameters' gradients unreduced in the next step.

Trigger: wrap a model in DistributedDataParallel, then freeze a submodule with
`requires_grad_(False)` (staged fine-tuning: Lightning's BaseFinetuning under the DDP
strategy), then train a step. The reducer was built at construction over the parameters
that required grad then; the frozen ones never produce a gradient, so the bucket they share
with trainable parameters is never reduced and those parameters keep their rank-local
gradients: training goes on with unaveraged gradients, nothing raises in that step (the
next one raises "Expected to have finished reduction in the prior iteration"). DDP's docs
say parameters must not be added or removed after construction; freezing is neither, and
is silent. Found by the programs generator, shrunk to `ddp-ws4-w16-l3-sgd:freeze=head,step,
fwd_bwd` ("at action fwd_bwd: blocks.N.norm.bias: gradient SQNR"), torch 2.13.0 CPU, fixes
off, 2026-12-06. Controls: the freeze before wrapping; one process.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("when", ["after_wrap", "before_wrap_control"])
def test_the_trainable_gradients_are_averaged_after_a_freeze(dist, when: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    if when != "after_wrap":
        model[1].requires_grad_(False)
    ddp = DistributedDataParallel(model, process_group=dist.mesh().get_group())
    if when == "after_wrap":
        model[1].requires_grad_(False)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1 + dist.rank))  # each rank its rows
    ddp(x).sum().backward()
    local = model[0].weight.grad.clone()
    averaged = local.clone()
    torch.distributed.all_reduce(averaged, group=dist.mesh().get_group())
    averaged /= dist.world_size
    assert model[1].weight.grad is None
    assert torch.allclose(local, averaged, atol=1e-6), (
        f"DDP ({when}): the trainable layer's gradient is this rank's own, never averaged over the ranks")
