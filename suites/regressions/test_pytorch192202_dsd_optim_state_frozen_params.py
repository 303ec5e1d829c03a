"""DSD drops or refuses optimizer state around a freeze: pytorch#192202 (open).

Two faces of one cause in torch.distributed.checkpoint.state_dict, both met by staged
fine-tuning (Lightning's BaseFinetuning freeze/unfreeze, torchtune's LoRA recipes) that
checkpoints through get/set_optimizer_state_dict (torchtitan's checkpointer):
  - a parameter trained, then frozen, keeps its Adam moments in the optimizer and in the
    checkpoint, but set_optimizer_state_dict filters the loaded state by requires_grad and
    drops them (a resume silently restarts its moments: "entries missing from the run");
  - a parameter frozen during the first step and unfrozen later has no state; _init_optim_state
    returns early because other parameters have state, so the save lacks it and the strict
    load raises "Missing optimizer state for parameter ... in checkpoint".
Found by the programs generator (2026-12-06, torch 2.13.0 CPU, fixes off) as
`fsdp-ws2-w8-l1-adamw:fwd_bwd,step,freeze=head,save,load` and
`fsdp-ws2-w8-l1-adamw:freeze=head,fwd_bwd,step,unfreeze=head,save,load`; both fail on 2.15.0 too.
Controls: nothing frozen after training; a parameter frozen throughout.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


def _model_and_optimizer(dist):
    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    fully_shard, _ = fsdp_api()
    fully_shard(model[0], mesh=dist.mesh())
    fully_shard(model, mesh=dist.mesh())
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(model, opt) -> None:
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("after_step", ["freeze_head", "nothing_frozen_control"])
def test_the_state_of_a_parameter_frozen_after_training_survives_a_load(dist, after_step: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    model, opt = _model_and_optimizer(dist)
    _train(model, opt)
    if after_step == "freeze_head":
        for q in model[1].parameters():
            q.requires_grad_(False)
    saved = get_optimizer_state_dict(model, opt)
    resumed = torch.optim.AdamW(model.parameters(), lr=1e-2)
    set_optimizer_state_dict(model, resumed, saved)
    assert len(resumed.state) == len(opt.state), (
        f"set_optimizer_state_dict kept the state of {len(resumed.state)} of {len(opt.state)} parameters "
        f"({len(saved['state'])} saved): the frozen head's moments were dropped")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("before_save", ["unfreeze_head", "head_frozen_throughout_control"])
def test_a_parameter_unfrozen_after_the_first_step_saves_and_loads(dist, before_save: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    model, opt = _model_and_optimizer(dist)
    for q in model[1].parameters():
        q.requires_grad_(False)
    _train(model, opt)
    if before_save == "unfreeze_head":
        for q in model[1].parameters():
            q.requires_grad_(True)
    saved = get_optimizer_state_dict(model, opt)
    set_optimizer_state_dict(model, torch.optim.AdamW(model.parameters(), lr=1e-2), saved)
