"""FSDP2 with set_reshard_after_backward(False): after a synchronized backward the module's
parameters are the unsharded ones, which hold no gradient (the reduce-scattered gradient sits
on the sharded DTensor the optimizer holds), so `clip_grad_norm_(model.parameters(), ...)`
clips nothing and returns 0: silently unclipped training.

Trainers keep reshard_after_backward False to skip the backward all-gathers (ZeRO-2 style:
lingbot-vla's FSDP2 ZeRO-2 mode, 2026, had to clip through the optimizer's param_groups
instead; pytorch#124319's example sets it per microbatch) and clip through model.parameters()
as torchtitan, accelerate and Lightning do. Found by the programs generator as
`fsdp-ws2-w8-l1-sgd:reshard,fwd_bwd,clip=0.05` (torch 2.13.0 CPU, fixes off, 2026-12-06: "at
action clip=0.05: blocks.0.norm.bias: gradient SQNR ... dB"). Control: the default (resharded
after backward), where model.parameters() are the sharded parameters with their gradients.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("reshard_after_backward", ["false", "default_control"])
def test_clip_grad_norm_over_model_parameters_sees_the_gradients(dist, reshard_after_backward) -> None:
    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8))
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    fully_shard, _ = fsdp_api()
    for module in (model[0], model[2], model):
        fully_shard(module, mesh=dist.mesh())
    if reshard_after_backward == "false":
        model.set_reshard_after_backward(False)
    x = torch.randn(4 * dist.world_size, 8, generator=torch.Generator().manual_seed(1))
    rows = x.chunk(dist.world_size)[dist.rank]
    model(rows).square().mean().backward()
    # the single-process total norm of the same gradients (the mean over the ranks' rows)
    w0, b0, g, b, w2, b2 = reference
    h = torch.nn.functional.layer_norm(x @ w0.T + b0, (8,), g, b) @ w2.T + b2
    h.square().mean().backward()
    expected = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in reference]))
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e-3)
    total = total.full_tensor() if hasattr(total, "full_tensor") else total
    with_grad = sum(p.grad is not None for p in model.parameters())
    assert torch.allclose(total, expected, rtol=1e-4), (
        f"clip_grad_norm_(model.parameters()) after backward returned {float(total):.6g}, the gradients' "
        f"norm is {float(expected):.6g}: {with_grad} of {len(reference)} parameters hold a gradient")
