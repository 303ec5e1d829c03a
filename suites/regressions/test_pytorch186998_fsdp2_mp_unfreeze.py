"""FSDP2 mixed precision fails after unfreezing a module whose first forward ran frozen:
pytorch#186998 (closed; fixed by 2.15.0).

Staged fine-tuning under FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32) (torchtitan's and torchtune's default policy): a module frozen for its
first forward resolves its group's mixed-precision dtypes without a reduce dtype, so after
it is unfrozen its bf16-reduced gradient is assigned to the float32 sharded parameter:
"attempting to assign a gradient with dtype 'c10::BFloat16' to a tensor with ... 'Float'".
Found by the programs generator as `fsdp_mp-ws2-w8-l1-sgd:freeze=block0,fwd_bwd,unfreeze=block0,fwd_bwd`
(2026-12-06, torch 2.13.0 CPU, fixes off); 2.15.0 passes. Control: never frozen.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("first_forward", ["frozen", "trainable_control"])
def test_a_module_unfrozen_after_a_frozen_first_forward_trains_under_mixed_precision(dist, first_forward) -> None:
    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    fully_shard, policy = fsdp_api()
    mp = policy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for module in (model[0], model[1], model):
        fully_shard(module, mesh=dist.mesh(), mp_policy=mp)
    model[0].requires_grad_(first_forward != "frozen")
    model(torch.randn(4, 8)).float().sum().backward()
    model[0].requires_grad_(True)
    model(torch.randn(4, 8)).float().sum().backward()
    assert model[0].weight.grad is not None and model[0].weight.grad.dtype == torch.float32
