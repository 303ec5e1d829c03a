"""DSD's flattened load raises an opaque TypeError where the nested load names the missing
state: pytorch#192224 (open; PR #192239).

A parameter unfrozen after the first step has no optimizer state, and the save leaves it out
(pytorch#192202's early return). Loading that checkpoint strictly, the nested format raises
"Missing optimizer state for parameter ... in checkpoint" (with the way out, strict=False);
the flattened format, which torchtitan uses (components/optimizer.py), builds an invalid state
instead and optimizer.load_state_dict fails with "float() argument must be a string or a real
number, not 'dict'". Found by the programs generator as
`fsdp-ws2-w8-l1-adamw:freeze=head,fwd_bwd,step,unfreeze=head,save=flat,load` (2026-12-06, torch
2.13.0 CPU, fixes off; 2.15.0 the same). The test accepts the load succeeding (pytorch#192202
fixed) or the named error; control: the nested format.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("layout", ["flattened", "nested_control"])
def test_a_load_without_a_parameters_state_names_it(dist, layout: str) -> None:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    fully_shard, _ = fsdp_api()
    fully_shard(model[0], mesh=dist.mesh())
    fully_shard(model, mesh=dist.mesh())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for q in model[1].parameters():
        q.requires_grad_(False)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    for q in model[1].parameters():
        q.requires_grad_(True)
    options = StateDictOptions(flatten_optimizer_state_dict=layout == "flattened")
    saved = get_optimizer_state_dict(model, opt, options=options)
    try:
        set_optimizer_state_dict(model, torch.optim.AdamW(model.parameters(), lr=1e-2), saved, options=options)
    except RuntimeError as exc:
        assert "Missing optimizer state" in str(exc), exc
