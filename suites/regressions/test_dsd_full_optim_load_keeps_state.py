"""DSD: a full optimizer state dict that holds no state, loaded into an optimizer that has state since, leaves that state.

Trigger: `get_optimizer_state_dict(model, opt, StateDictOptions(full_state_dict=True,
cpu_offload=True))` taken after a backward and before the first step (torchtune's and
Lightning's full checkpoints; the state is legitimately empty then: `_init_optim_state`
returns early once gradients exist), a step, then a resume from it with
`set_optimizer_state_dict(..., StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))`.
`optimizer.load_state_dict` of the same dict empties the state, and so does DSD's sharded path
(default options); the full broadcast path leaves every moment and step the optimizer had, so
the resumed run continues from the post-save optimizer. Silent. With or without FSDP2.

Found by the programs generator (as a near miss of pytorch164929 by its load alternative:
`fsdp_f8-ws2-w16-l1-adamw_groups:fwd_bwd,fwd_bwd,save=full,step=precompute,...,load`, seed
2026-12-07-f8, and on tp in the 2026-12-07 night run), replayed as
`fsdp-ws2-w8-l1-adamw:fwd_bwd,save=full,step,load` and reproduced standalone on torch 2.13.0 and
2.15.0. Neighbour upstream: pytorch#140898 (closed: the save side of the same stateless rule);
none reports the load. Draft: reports/upstream-draft-dsd-full-optim-load-keeps-state.md.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("path", ["full_broadcast", "sharded_control"])
def test_a_stateless_checkpoint_loads_as_no_state(dist, path: str) -> None:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    from ..runner.parallelize import fsdp_api

    fully_shard, _ = fsdp_api()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    fully_shard(model, mesh=dist.mesh())
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).sum().backward()
    full = path == "full_broadcast"
    saved = copy.deepcopy(get_optimizer_state_dict(
        model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True) if full else StateDictOptions()))
    opt.step()
    set_optimizer_state_dict(model, opt, saved, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
                             if full else StateDictOptions())
    assert len(opt.state) == 0, (
        f"{path}: after loading a checkpoint with no optimizer state the optimizer kept the state "
        f"the full checkpoint did not hold ({len(opt.state)} entries)")
