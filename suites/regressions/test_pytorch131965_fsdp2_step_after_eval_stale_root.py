"""FSDP2: an optimizer step between an eval forward and the next forward is lost on the root's
parameters: the next forward computes with the pre-step weights.

Trigger: the root module keeps its unsharded parameters after a forward no backward follows
(by design, pytorch#131965 / #144289), e.g. an eval forward under no_grad; the optimizer,
which holds the sharded parameters, steps; the next forward finds the root "already
unsharded", does not all-gather, and computes with the stale unsharded weights. Silent.
Loops that evaluate between the backward and the step (validation or an EMA/metric forward
inside an accumulation window, before the optimizer step) meet it; torchtune's and
torchtitan's order (step, then validate) does not. Found by the programs generator as
`fsdp_tp-ws4-w8-l3-sgd:...,eval=inference_mode,step,eval=inference_mode,...`, and as
`fsdp-ws2-w8-l1-sgd:fwd_bwd,eval,step,fwd_bwd` ("at action fwd_bwd: gradient SQNR"),
torch 2.13.0 CPU, fixes off, 2026-12-06. Controls: one process; model.reshard() after the
eval forward.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


def _model(dist, sharded: bool) -> torch.nn.Module:
    """Two linears, FSDP2 on the first and on the root (the root keeps the second's parameters)."""
    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    if sharded:
        fully_shard, _ = fsdp_api()
        fully_shard(model[0], mesh=dist.mesh())
        fully_shard(model, mesh=dist.mesh())
    return model


def _output_after_step(dist, sharded: bool, reshard_after_eval: bool) -> torch.Tensor:
    model = _model(dist, sharded)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    model(x).sum().backward()
    with torch.no_grad():
        model(x)  # an eval forward between the backward and the step
    if sharded and reshard_after_eval:
        model.reshard()
    opt.step()
    with torch.no_grad():
        return model(x).detach().clone()


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("reshard_after_eval", [False, True], ids=["plain", "reshard_control"])
def test_a_step_after_an_eval_forward_reaches_the_next_forward(dist, reshard_after_eval: bool) -> None:
    expected = _output_after_step(dist, sharded=False, reshard_after_eval=False)
    got = _output_after_step(dist, sharded=True, reshard_after_eval=reshard_after_eval)
    assert torch.allclose(got, expected, atol=1e-5), (
        "FSDP2: the forward after the optimizer step computed with the root's pre-step weights "
        f"(max |diff| {float((got - expected).abs().max()):.3g} against one process)")


def _trained_then_evaluated(dist, sharded: bool, reshard_after_eval: bool) -> torch.nn.Module:
    """The model after a backward and then an eval forward under no_grad (the root stays unsharded)."""
    model = _model(dist, sharded)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    model(x).sum().backward()
    with torch.no_grad():
        model(x)
    if sharded and reshard_after_eval:
        model.reshard()
    return model


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("reshard_after_eval", [False, True], ids=["clip_plain", "clip_reshard_control"])
def test_clipping_after_an_eval_forward_sees_every_gradient(dist, reshard_after_eval: bool) -> None:
    """The clip face (programs `fsdp-ws2-w8-l1-sgd:fwd_bwd,eval,clip` on torch 2.15.0, 2026-12-07:
    "clip total norm N vs reference N"): after the eval forward the root's registered
    parameters are its unsharded ones, which hold no gradient, so clip_grad_norm_ over
    model.parameters() measures (and clips) the other modules' gradients only. Silent."""
    def norm(model) -> float:
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9)
        return float(total.full_tensor() if hasattr(total, "full_tensor") else total)

    expected = norm(_trained_then_evaluated(dist, sharded=False, reshard_after_eval=False))
    got = norm(_trained_then_evaluated(dist, sharded=True, reshard_after_eval=reshard_after_eval))
    assert abs(got - expected) <= 1e-5 * expected, (
        f"FSDP2: clip_grad_norm_(model.parameters()) after an eval forward measured {got:.6g}, one process "
        f"{expected:.6g}: the root's unsharded parameters hold no gradient")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("reshard_after_eval", [False, True], ids=["load_plain", "load_reshard_control"])
def test_a_full_state_dict_loads_after_an_eval_forward(dist, reshard_after_eval: bool) -> None:
    """The load face (programs `fsdp-ws2-w8-l1-sgd0:save=full,eval,load` on torch 2.15.0,
    2026-12-07: "Error(s) in loading state_dict for FSDPNet"): a full state dict saved before
    the eval, loaded after it with broadcast_from_rank0 as torchtune and Lightning load,
    meets the root's unsharded parameters where DTensors are expected."""
    import copy

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    model = _trained_then_evaluated(dist, sharded=True, reshard_after_eval=False)
    if reshard_after_eval:
        model.reshard()
    saved = copy.deepcopy(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
    with torch.no_grad():
        model(torch.randn(4, 8, generator=torch.Generator().manual_seed(2)))  # the eval between save and load
    if reshard_after_eval:
        model.reshard()
    set_model_state_dict(model, saved, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
