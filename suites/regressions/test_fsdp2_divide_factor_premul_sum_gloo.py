"""FSDP2's set_gradient_divide_factor on a gloo group raises in the reduce-scatter (2 ranks).

Trigger: torchtitan's `disable_fsdp_gradient_division` (`distributed/fsdp.py`) calls
`set_gradient_divide_factor(1.0)` on every FSDP module and normalizes the loss by the global
token count itself. FSDP2 (`_fsdp_collectives._get_gradient_divide_factors`) then reduces with
`ReduceOp.PREMUL_SUM(1 / factor)` whatever the backend, and gloo has no PREMUL_SUM: the first
backward raises "Cannot use ReduceOp.PREMUL_SUM with Gloo" (torch 2.13.0 and 2.15.0, CPU).
FSDP2 already holds the path that works: with `set_force_sum_reduction_for_comms(True)` it
reduces with SUM and divides after (`[force_sum]`, the control, equals the single-process
gradient). The XPU face (oneCCL across nodes) was met by torchtitan PR#2332. Found by the
programs generator's `reshard=divide` (2026-12-07).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
DIM = 8
ROWS = 4


@pytest.mark.world_size(2)
@pytest.mark.parametrize("reduction", ["default", "force_sum"])
def test_gradient_divide_factor_one_with_global_normalization(dist, reduction: str) -> None:
    from ..runner.parallelize import fsdp_api

    fully_shard, _ = fsdp_api()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)).to(dist.device)
    reference = nn.Sequential(nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)).to(dist.device)
    reference.load_state_dict(model.state_dict())
    fully_shard(model, mesh=dist.mesh())
    model.set_gradient_divide_factor(1.0)
    if reduction == "force_sum":
        model.set_force_sum_reduction_for_comms(True)
    x = torch.randn(ROWS * dist.world_size, DIM, generator=torch.Generator().manual_seed(1)).to(dist.device)
    rows = slice(ROWS * dist.rank, ROWS * (dist.rank + 1))
    (model(x[rows]).pow(2).sum() / x.shape[0]).backward()  # each rank's sum over the global count
    (reference(x).pow(2).sum() / x.shape[0]).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p.grad.full_tensor().cpu(), q.grad.cpu(), rtol=1e-5, atol=1e-7), \
            f"{name}: summed gradient differs from the reference"
