"""Saving a checkpoint before the optimizer's first step changes training (pytorch#164929).

Trigger: `get_optimizer_state_dict(model, opt)` (what torchtitan's checkpointer, Lightning's
ModelParallelStrategy and the programs generator's `save` call) on an optimizer that has
no state yet: torch.distributed.checkpoint.state_dict's `_init_optim_state` materializes
the lazy state by running `opt.step()` with zero gradients at lr 0, and leaves what that
step did. AdamW's `step` goes 0 -> 1, so the first real update uses step-2 bias
correction and every parameter moves ~1.3x less than without the save. Found by the
programs generator (`tp-ws4-w16-l1-adamw:zero_grad=zeros,fwd_bwd,zero_grad,save,sched`,
torch 2.13.0 CPU, fixes off, 2026-12-06: "at action save: optimizer state: entries the
reference lacks"), on every layout, dcp and full state dicts alike. Single process: no
parallelism is needed. SGD with momentum is the control: its zero momentum buffer is inert.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


def _first_update(optim: str, save_first: bool) -> torch.Tensor:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8, bias=False)
    before = model.weight.detach().clone()
    opt = (torch.optim.AdamW(model.parameters(), lr=0.1) if optim == "adamw"
           else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if save_first:
        get_optimizer_state_dict(model, opt)
    model.weight.grad = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    opt.step()
    return model.weight.detach() - before


@pytest.mark.parametrize("optim", ["adamw", "sgd_momentum_control"])
def test_saving_before_the_first_step_leaves_the_first_update_alone(optim: str) -> None:
    kind = "adamw" if optim == "adamw" else "sgd"
    plain, saved = _first_update(kind, False), _first_update(kind, True)
    ratio = float(saved.norm() / plain.norm())
    assert torch.allclose(saved, plain, rtol=1e-5, atol=1e-7), (
        f"get_optimizer_state_dict before the first step changed the first {kind} update: "
        f"its norm is {ratio:.3f}x the update without the save")


@pytest.mark.parametrize("kind", ["full_load", "sharded_load_control"])
def test_loading_a_state_saved_before_the_first_step_adds_no_state(kind: str) -> None:
    """The set side of the same `_init_optim_state`: set_optimizer_state_dict(full_state_dict=True)
    of a checkpoint taken before the first step (no state in it) into an optimizer without
    state or gradients (after zero_grad) runs the hidden step itself and keeps its state:
    AdamW holds `step` 1 where the checkpoint held nothing. Found by the programs generator as
    `tp-ws4-w16-l2-adamw_groups:fwd_bwd,save=full,zero_grad,step,load` (torch 2.13.0 CPU, fixes
    off, 2026-12-06: "at action load: optimizer state: entries the reference lacks"). The
    sharded path (full_state_dict=False) adds nothing: the control."""
    import copy

    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 8)).sum().backward()  # gradients exist: the save itself adds nothing
    options = StateDictOptions(full_state_dict=kind == "full_load")
    saved = copy.deepcopy(get_optimizer_state_dict(model, opt, options=options))
    assert not saved["state"] and not opt.state
    opt.zero_grad(set_to_none=True)
    set_optimizer_state_dict(model, opt, saved, options=options)
    steps = [float(s["step"]) for s in opt.state.values() if "step" in s]
    assert not opt.state, (f"get_optimizer_state_dict before the first step changed the optimizer at the load: "
                           f"{len(opt.state)} state entries appeared, steps {steps}")
