"""FSDP2: a module frozen while its parameters are unsharded trains again a step later.

Trigger: `fully_shard` a model, train a step, run an eval forward under no_grad (the root
stays unsharded after a forward no backward follows, by design: pytorch#131965), then
freeze the head through its module, `requires_grad_(False)`, as staged fine-tuning does
(Lightning's BaseFinetuning.freeze_module; BackboneFinetuning acts at an epoch start,
right after validation). The call reaches the unsharded tensors registered at that moment
only; the sharded parameters (what the optimizer and the checkpoint hold) keep
requires_grad=True. The step right after the freeze computes no gradient for the head;
its backward reshards the root, and the next unshard takes requires_grad from the sharded
parameters again: from the second step on the "frozen" head gets gradients and the
optimizer moves it. Silent: nothing raises. Found by the programs generator (first as
`fsdp-ws4-w32-l1-sgd:reshard,fwd_bwd,freeze=head,fwd_bwd=nosync,fwd_bwd,sched,fwd_bwd,clip`,
"head.bias: has a gradient the reference does not"), torch 2.13.0 CPU, fixes off,
2026-12-06. Controls: one process; FSDP2 frozen after an ordinary backward (resharded: the
call reaches the sharded parameters); and set_reshard_after_backward(False), where the
unsharded parameters stay registered through both steps (the freeze holds that long).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


def _eval_forward(model: torch.nn.Module, x: torch.Tensor) -> None:
    """An eval forward under no_grad, as validation runs between epochs: FSDP2's root stays
    unsharded after it (no backward follows), which is the moment these faces need."""
    model.eval()
    with torch.no_grad():
        model(x)
    model.train()


def _frozen_head_gets_a_gradient(dist, sharded: bool, moment: str) -> bool:
    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    if sharded:
        fully_shard, _ = fsdp_api()
        fully_shard(model[0], mesh=dist.mesh())
        fully_shard(model, mesh=dist.mesh())
        if moment == "reshard_after_backward_false_control":
            model.set_reshard_after_backward(False)
    held = list(model.parameters())  # as an optimizer holds them (sharded under FSDP2)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    model(x).sum().backward()
    if moment == "after_eval":
        _eval_forward(model, x)
    model[1].requires_grad_(False)  # freeze the head through its module, as users do
    got = False
    for _ in range(2):  # the step right after the freeze, and the one after it
        for p in held:
            p.grad = None
        model(x).sum().backward()
        got = got or any(p.grad is not None for p in held[2:])
    return got


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("moment", ["after_eval", "reshard_after_backward_false_control", "after_backward_control"])
def test_a_module_frozen_mid_run_gets_no_gradient(dist, moment: str) -> None:
    assert not _frozen_head_gets_a_gradient(dist, sharded=False, moment=moment)
    assert not _frozen_head_gets_a_gradient(dist, sharded=True, moment=moment), (
        f"FSDP2: the head frozen with requires_grad_(False) ({moment}) gets a gradient again a step later: "
        "the call reached the unsharded parameters only; the sharded ones still require grad")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("reshard_after_backward", ["false", "default_control"])
def test_freezing_after_a_backward_freezes_the_trained_parameters(dist, reshard_after_backward) -> None:
    """A unit of its own under set_reshard_after_backward(False) (programs
    `fsdp-ws2-w8-l1-sgd:reshard,fwd_bwd,freeze` on torch 2.15.0, 2026-12-07: "at action
    freeze: requires_grad differs: parameters train in the run only"): frozen through
    requires_grad_(False) right after the backward, while it is unsharded; it reshards after
    the next forward and unshards again in that step's backward from the sharded parameters,
    which still require grad: frozen for one forward only. Silent."""
    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    fully_shard, _ = fsdp_api()
    for module in (model[0], model):
        fully_shard(module, mesh=dist.mesh())
    if reshard_after_backward == "false":
        model.set_reshard_after_backward(False)
    model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))).sum().backward()
    model[0].requires_grad_(False)
    frozen = {n for n, p in model.named_parameters() if n.startswith("0.") and not p.requires_grad}
    model(torch.randn(4, 8, generator=torch.Generator().manual_seed(2))).sum().backward()  # the next step
    still = sorted(n for n, p in model.named_parameters() if n in frozen and p.requires_grad)
    assert frozen and not still, f"frozen after the backward, {still} require grad again at the next step"


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("moment", ["after_eval", "after_backward_control"])
def test_a_module_unfrozen_mid_run_trains_again(dist, moment: str) -> None:
    """The unfreeze face (programs `fsdp-ws2-w8-l1-sgd:freeze=head,eval,unfreeze=head` on torch
    2.13.0, night of 2026-12-07: "at action unfreeze=head: requires_grad differs: parameters are
    frozen in the run only"): the head frozen while sharded, an eval forward (the root stays
    unsharded), then unfrozen through its module, as staged fine-tuning's unfreeze does
    (Lightning's BaseFinetuning.unfreeze_and_add_param_group after validation). The call
    reaches the unsharded tensors only; the next reshard takes requires_grad=False back from
    the sharded parameters, and the "unfrozen" head never trains. Silent."""
    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    fully_shard, _ = fsdp_api()
    for module in (model[0], model):
        fully_shard(module, mesh=dist.mesh())
    held = list(model.parameters())
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    model[1].requires_grad_(False)
    model(x).sum().backward()
    if moment == "after_eval":
        _eval_forward(model, x)
    model[1].requires_grad_(True)  # unfreeze the head through its module, as users do
    names = [n for n, _ in model.named_parameters()]
    missing: list[str] = []
    for step in range(2):  # the step right after the unfreeze, and the one after its reshard
        for p in held:
            p.grad = None
        model(x).sum().backward()
        missing += [f"{n} (step {step})" for n, p in zip(names, held) if n.startswith("1.") and p.grad is None]
    frozen = [n for n, p in zip(names, held) if n.startswith("1.") and not p.requires_grad]
    assert not missing and not frozen, (f"FSDP2: the head unfrozen with requires_grad_(True) ({moment}): no gradient "
                                        f"for {missing}; still frozen: {frozen}")
