"""FSDP2's custom gradient divide factor on a backend without PREMUL_SUM (2 ranks).

Trigger: `FSDPModule.set_gradient_divide_factor(f)` with f different from the
reduce-scatter group's size (torchtitan sets the data-parallel size on the experts'
FSDP2 units, which shard over the smaller efsdp mesh). For fp32/bf16 gradients FSDP2
then reduces with `ReduceOp.PREMUL_SUM(1 / f)` whatever the process group supports:
gloo raises "Cannot use ReduceOp.PREMUL_SUM with Gloo" in backward (torch 2.13.0 CPU,
2026-12-02); HCCL has no PreMulSum either (ByteDance-Seed/VeOmni#241), XPU neither
(pytorch/torchtitan#2332). FSDP2's own `set_force_sum_reduction_for_comms(True)` takes
the SUM + divide path that every backend has: the control case.
Found by suites/test_scenarios.py's `ep_fsdp-moe-eager-clip_mesh-ws4` (EP laid out as
torchtitan lays it out, 4 ranks). Draft upstream issue: reports/upstream-draft-fsdp2-divide-factor-premul-sum.md.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
DIM = 8
FACTOR = 4.0
"""Not the group's size (2): FSDP2 cannot use ReduceOp.AVG and builds a PREMUL_SUM."""


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(120)
@pytest.mark.parametrize("path", ["divide_factor", "force_sum"])
def test_gradient_divide_factor_reduces_on_every_backend(dist, path: str) -> None:
    from ..runner.parallelize import fsdp_api

    fully_shard, _ = fsdp_api()
    torch.manual_seed(0)
    model = nn.Linear(DIM, DIM, bias=False).to(dist.device)
    fully_shard(model, mesh=dist.mesh())
    model.set_gradient_divide_factor(FACTOR)
    if path == "force_sum":
        if not hasattr(model, "set_force_sum_reduction_for_comms"):
            pytest.skip("this torch's FSDP2 has no set_force_sum_reduction_for_comms")
        model.set_force_sum_reduction_for_comms(True)
    x = torch.full((2, DIM), float(dist.rank + 1), device=dist.device)
    model(x).sum().backward()
    # every rank's gradient of sum(x @ W.T) is ones(DIM, 1) @ x.sum(0)[None]; FSDP2 sums the
    # ranks' and divides by FACTOR, then keeps this rank's row shard
    total = sum(torch.full((2, DIM), float(r + 1)).sum(0) for r in range(dist.world_size))
    expected = (torch.ones(DIM, 1) * total[None]) / FACTOR
    got = model.weight.grad.full_tensor().cpu()
    assert torch.allclose(got, expected), f"{path}: gradient {got[0, :3]} vs {expected[0, :3]}"
