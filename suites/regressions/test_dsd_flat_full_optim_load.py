"""DSD cannot load a flattened full optimizer state dict: set_optimizer_state_dict with
StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True) raises KeyError
(no upstream issue found yet: reports/upstream-draft-dsd-flat-full-optim-load.md).

torchtitan saves optimizers flattened (components/optimizer.py); `dcp_to_torch_save` writes
such a checkpoint out as one file with the flat keys (`state.FQN.exp_avg`,
`param_groups.FQN.lr`), and a full load of that file (broadcast from rank 0, as Hugging Face
and torchtune load full state dicts into sharded models) must say it is flat. The load's
full_state_dict branch (_load_optim_state_dict) takes the optimizer's local state dict as the
template for the broadcast, and with the flatten option that template is flat too, so the
dict it hands optimizer.load_state_dict has no "state" / "param_groups" keys: KeyError 'state'
on rank 0, 'param_groups' on the others (without broadcast_from_rank0: KeyError
'param_groups.0.params.0'). Found by the programs generator's `load=file` after a
`save=flat` (2026-12-07, torch 2.13.0 CPU, fixes off; 2.15.0 the same). Control: the same
load of the nested format.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("layout", ["flattened", "nested_control"])
def test_a_full_optimizer_state_dict_loads_flattened_as_nested(dist, layout: str) -> None:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    fully_shard, _ = fsdp_api()
    fully_shard(model, mesh=dist.mesh())
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    model.zero_grad(set_to_none=True)  # a restart holds no gradients
    flat = layout == "flattened"
    saved = get_optimizer_state_dict(model, opt, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True, flatten_optimizer_state_dict=flat))
    resumed = torch.optim.AdamW(model.parameters(), lr=0.1)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, flatten_optimizer_state_dict=flat)
    try:
        set_optimizer_state_dict(model, resumed, saved if dist.rank == 0 else {}, options=options)
    except KeyError as exc:
        raise AssertionError(f"{layout} full optimizer state dict: set_optimizer_state_dict raised "
                             f"KeyError {exc}") from None
    for p in model.parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(resumed.state[p][key].full_tensor(), opt.state[p][key].full_tensor()), key
