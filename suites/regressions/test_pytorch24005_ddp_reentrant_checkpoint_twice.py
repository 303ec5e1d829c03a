"""DDP: reentrant activation checkpointing (Hugging Face's default) with two forwards before one
backward raises "Expected to mark a variable ready only once".

Trigger: a DDP model whose forward checkpoints a block with `torch.utils.checkpoint(...,
use_reentrant=True)` (transformers' `gradient_checkpointing_enable()` default, HF Trainer and
accelerate turning DDP's find_unused_parameters off for it), called twice before one backward:
two views of a contrastive loss, a GAN discriminator on real then fake, DPO written with
separate chosen and rejected forwards. Each reentrant checkpoint runs its own backward, in which
the reducer's hook of every block parameter fires, so the second marks the parameters ready a
second time. DDP's docs (`DistributedDataParallel`'s note on torch.utils.checkpoint, pytorch PR
#106985) support reentrant checkpointing only where each layer is checkpointed at most once;
the error has been reported since pytorch#24005 (open), and by users of accelerate (#389) and
ms-swift (#3171). Found by the programs generator (round later_ac, seed 2026-12-09-ac, torch
2.13.0 CPU, fixes off), shrunk to `ddp_hfac-ws2-w8-l1-sgd:fwd_bwd=twice`. Controls:
use_reentrant=False, and static_graph=True (DDP's documented workaround), both of which average
the gradient.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("how", ["reentrant", "non_reentrant_control", "reentrant_static_graph_control"])
def test_two_checkpointed_forwards_then_one_backward(dist, how: str) -> None:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.checkpoint import checkpoint

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x.detach().requires_grad_(True)  # enable_input_require_grads()
            return self.head(checkpoint(self.block.__call__, x, use_reentrant=how != "non_reentrant_control"))

    torch.manual_seed(0)
    group = dist.mesh().get_group()
    model = Net()
    ddp = DistributedDataParallel(model, process_group=group, static_graph=how.endswith("static_graph_control"))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1 + dist.rank))  # each rank its rows
    ((ddp(x[:2]).square().mean() + ddp(x[2:]).square().mean()) / 2).backward()
    local = model.block.weight.grad.clone()
    averaged = local.clone()
    torch.distributed.all_reduce(averaged, group=group)
    assert torch.allclose(local, averaged / dist.world_size, atol=1e-6), (
        f"DDP ({how}): the checkpointed block's gradient is this rank's own, never averaged over the ranks")
