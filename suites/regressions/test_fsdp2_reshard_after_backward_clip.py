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


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("reshard_after_backward", ["false", "default_control"])
def test_the_forward_after_an_optimizer_step_uses_the_stepped_parameters(dist, reshard_after_backward) -> None:
    """The second face: the optimizer steps the sharded parameters, but the modules keep the
    unsharded ones registered, so the next forward computes with the weights from before the
    step (found as `fsdp-ws2-w16-l3-adamw_groups:...,reshard,reset_state,clip,fwd_bwd,step,fwd_bwd`:
    "at action fwd_bwd: blocks.0.norm.bias: gradient SQNR ... dB")."""
    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    fully_shard, _ = fsdp_api()
    for module in (model[0], model[1], model):
        fully_shard(module, mesh=dist.mesh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference, lr=0.1)
    if reshard_after_backward == "false":
        model.set_reshard_after_backward(False)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))  # the same rows on every rank

    def ref_forward() -> torch.Tensor:
        w0, b0, w1, b1 = reference
        return (x @ w0.T + b0) @ w1.T + b1

    model(x).square().mean().backward()
    ref_forward().square().mean().backward()
    opt.step()
    ref_opt.step()
    with torch.no_grad():
        out, expected = model(x), ref_forward()
    assert torch.allclose(out, expected, atol=1e-6), (
        f"the forward after the optimizer step differs from the stepped reference by up to "
        f"{float((out - expected).abs().max()):.3g}: it used the parameters from before the step")
