"""set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True) rewrites the dict it is
given: on rank 0 its full tensors are replaced by the model's DTensor shards. Loading the same
dict again (a resume from an in-memory copy, a retry) is then not a load of the checkpoint: on
torch 2.15.0 under TP on 4 ranks rank 0 raises "Operator c10d.broadcast_.default does not have
a sharding strategy registered" inside the broadcast while the other ranks wait in it (a hang);
on 2.13.0 it went through. Nothing in the API says the argument is consumed.

Found by the programs generator on torch 2.15.0 (CPU, fixes off, 2026-12-06) as the shrink
candidate `tp-ws4-w16-l2-adamw_groups:fwd_bwd,step,fwd_bwd,zero_grad=zeros,fwd_bwd,save=full,zero_grad,load,step,load`
(RankHang; the programs runner now loads a fresh copy each time, as torch.load of a file gives).
The control loads a copy of the dict: the caller's dict keeps its tensors.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("passed", ["the_dict", "a_copy_control"])
def test_set_model_state_dict_leaves_the_dict_it_loads_alone(dist, passed) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    parallelize_module(model, dist.mesh(), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    kept = {k: v.clone() for k, v in full.items()}
    given = full if passed == "the_dict" else copy.deepcopy(full)
    set_model_state_dict(model, given, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    changed = sorted(k for k, v in full.items() if type(v) is not torch.Tensor or not torch.equal(v, kept[k]))
    assert not changed, (f"set_model_state_dict rewrote the dict it was given on rank {dist.rank}: "
                         f"{changed} now hold {type(full[changed[0]]).__name__}")
