"""pytorch#158719's opt-in: FSDP2's set_reduce_scatter_unused_params(True) gives a parameter
that NO rank used a zero gradient, where DistributedDataParallel(find_unused_parameters=True),
the option its docstring likens it to, leaves it None (pytorch#28294, fixed in DDP in 2019).

An optimizer cannot tell a zero gradient from an unused parameter: AdamW moves its moments
and applies weight decay to an expert that got no token anywhere, so FSDP2 MoE training
(per-expert loops that skip idle experts, as HF Mixtral / Qwen-MoE write them) drifts from
one-process and DDP training. Found 2026-12-06 by the models generator
(`fsdp-moe4-tied-uneven`: "the gradient (present on one side only) of
layers.N.ffn.experts.N.w1.weight") on torch 2.13.0, CPU, gloo. Upstream PR #174862 (open)
discusses deciding None from a global used-mask.
Control: DDP with find_unused_parameters on the same model. Pass means the unused
parameter's gradient is None after backward.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


class TwoBranches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)  # an expert no token reached on any rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("wrapper", ["fsdp2", "ddp"])
def test_a_parameter_no_rank_used_keeps_no_gradient(dist, wrapper: str) -> None:
    torch.manual_seed(0)
    model = TwoBranches().to(dist.device)
    if wrapper == "fsdp2":
        from ..runner.fsdp import fsdp_api

        fully_shard, _ = fsdp_api()
        fully_shard(model, mesh=dist.mesh())
        if not hasattr(model, "set_reduce_scatter_unused_params"):
            pytest.skip("this torch's FSDP2 has no set_reduce_scatter_unused_params")
        model.set_reduce_scatter_unused_params(True)
        runnable = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        runnable = DistributedDataParallel(model, find_unused_parameters=True)
    runnable(torch.randn(3, 4, device=dist.device)).sum().backward()
    assert model.used.weight.grad is not None
    assert model.unused.weight.grad is None, "a parameter no rank used got a gradient (zeros)"
