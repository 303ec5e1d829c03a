"""FSDP2: reentrant activation checkpointing around an FSDP2 block (Hugging Face's
`gradient_checkpointing_enable()` under accelerate's FSDP2) with two forwards before one backward
silently loses the first forward's gradient of the block.

Trigger: `fully_shard` per block and on the root; the root's forward calls each block through
`torch.utils.checkpoint.checkpoint(block.__call__, x, use_reentrant=True)` (transformers' models
do, from OUTSIDE the block's FSDP2 hooks), the input made to require grad
(`enable_input_require_grads()`); two forwards (two views, GAN real / fake, DPO's chosen and
rejected written as separate calls), one backward of their mean. The block's reduced, sharded
gradient is exactly the SECOND forward's contribution (the first's is lost: measured on a
one-block model, torch 2.13.0 and 2.15.0 CPU, gloo), no error, no warning. Each reentrant
checkpoint runs its own backward; FSDP2 reduces and reshards the block after the first of them,
and the other's gradient never reaches the sharded parameter. Controls: use_reentrant=False,
one forward per backward, no checkpointing (each matches the single-process reference).
pytorch#153354 (closed) reports the loud face of this combination (FSDP2 + AC + two forwards:
"got mixed torch.Tensor and DTensor" at a later step); this is the silent one. Found by the
programs generator (round later_ac, seed 2026-12-09-ac, torch 2.13.0, fixes off), shrunk to
`fsdp_hfac-ws2-w8-l1-sgd:fwd_bwd=twice`.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("how", ["reentrant_twice", "non_reentrant_twice_control", "reentrant_once_control"])
def test_the_checkpointed_block_gradient_holds_both_forwards(dist, how: str) -> None:
    from torch.utils.checkpoint import checkpoint

    from ..runner.fsdp import fsdp_api

    reentrant = not how.startswith("non_reentrant")
    twice = "twice" in how

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 8))
            self.head = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x.detach().requires_grad_(True)  # enable_input_require_grads()
            return self.head(checkpoint(self.block.__call__, x, use_reentrant=reentrant))

    def loss(model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
        if not twice:
            return model(rows).square().mean()
        return (model(rows[:2]).square().mean() + model(rows[2:]).square().mean()) / 2

    torch.manual_seed(0)
    ref = Net()
    run = copy.deepcopy(ref)
    fully_shard, _ = fsdp_api()
    fully_shard(run.block, mesh=dist.mesh())
    fully_shard(run, mesh=dist.mesh())
    sharded = dict(run.named_parameters())  # the DTensors an optimizer holds
    rows = torch.randn(dist.world_size, 4, 8, generator=torch.Generator().manual_seed(1))
    (sum(loss(ref, rows[i]) for i in range(dist.world_size)) / dist.world_size).backward()
    loss(run, rows[dist.rank]).backward()
    for name, param in ref.named_parameters():
        got = sharded[name].grad
        assert got is not None, f"FSDP2 ({how}): {name} has no gradient"
        got = got.full_tensor()
        assert torch.allclose(got, param.grad, atol=1e-6, rtol=1e-5), (
            f"FSDP2 ({how}): {name}'s gradient is not the reference's "
            f"(max |diff| {float((got - param.grad).abs().max()):.3g})")
