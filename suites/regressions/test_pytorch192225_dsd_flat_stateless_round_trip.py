"""DSD's flattened optimizer state dict gives a stateless optimizer empty state entries on
load: pytorch#192225 (open).

torchtitan saves and loads optimizers with StateDictOptions(flatten_optimizer_state_dict=True)
(components/optimizer.py). A round trip of plain SGD (no momentum: no state at all) loads
`{0: {}, 1: {}, ...}` where the optimizer had `{}`: _unflatten_optim_state_dict writes an
entry for every parameter before it knows whether the checkpoint holds any state for it.
Found by the programs generator as `fsdp-ws2-w8-l1-sgd0:fwd_bwd,step,save=flat,load`
(2026-12-06, torch 2.13.0 CPU, fixes off; 2.15.0 the same). Control: the nested format.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("layout", ["flattened", "nested_control"])
def test_a_stateless_optimizer_loads_no_state(dist, layout: str) -> None:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    fully_shard, _ = fsdp_api()
    fully_shard(model, mesh=dist.mesh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    options = StateDictOptions(flatten_optimizer_state_dict=layout == "flattened")
    resumed = torch.optim.SGD(model.parameters(), lr=0.1)
    set_optimizer_state_dict(model, resumed, get_optimizer_state_dict(model, opt, options=options), options=options)
    empty = sum(1 for entry in resumed.state.values() if not entry)
    assert len(resumed.state) == len(opt.state) == 0, (
        f"{layout} round trip of a stateless optimizer: {len(resumed.state)} state entries, {empty} of them empty "
        f"(saved from {len(opt.state)})")
