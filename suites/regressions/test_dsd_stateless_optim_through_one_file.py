"""A stateless optimizer's DCP checkpoint written out as one file (`dcp_to_torch_save`) cannot be
loaded as a full state dict: set_optimizer_state_dict raises KeyError 'param_groups.FQN.lr'
(no upstream issue found yet: reports/upstream-draft-dsd-stateless-optim-through-one-file.md).

Plain SGD (no momentum) keeps no state, so get_optimizer_state_dict returns `"state": {}`; DCP
saves no entry for the empty dict, and `dcp_to_torch_save` writes `{"param_groups": [...]}`
alone. set_optimizer_state_dict tells the nested format from the flattened one by the `state`
key (`_load_optim_state_dict`: `if _STATE in state_dict ... else _unflatten_optim_state_dict`),
so it reads the nested dict as flattened and looks up `param_groups.FQN.lr`. Found by the
programs generator's `load=file` as `tp-ws2-w8-l1-sgd0:save,load=file` (2026-12-07, torch
2.13.0 CPU, fixes off; 2.15.0 the same). Control: SGD with momentum (a state to save).
"""

from __future__ import annotations

import os

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_an_optimizer_loads_from_its_checkpoint_written_as_one_file(dist, tmp_path, momentum: float) -> None:
    import torch.distributed as tdist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    from ..runner.parallelize import fsdp_api

    where = [str(tmp_path)]
    tdist.broadcast_object_list(where, src=0)  # one directory for every rank
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    fully_shard, _ = fsdp_api()
    fully_shard(model, mesh=dist.mesh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    model.zero_grad(set_to_none=True)  # a restart holds no gradients
    dcp.save({"optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=where[0])
    path = os.path.join(where[0], "one.pt")
    if dist.rank == 0:
        dcp_to_torch_save(where[0], path)
    tdist.barrier()
    full = torch.load(path, weights_only=False)["optim"] if dist.rank == 0 else {}
    resumed = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    try:
        set_optimizer_state_dict(model, resumed, full,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    except KeyError as exc:
        raise AssertionError(f"SGD momentum={momentum} through one file: set_optimizer_state_dict raised "
                             f"KeyError {exc}") from None
