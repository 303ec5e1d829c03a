"""torch.optim.SGD(fused=True) over DTensor parameters (2 ranks): DTensor has no sharding
strategy for aten._fused_sgd_.

Trigger: FSDP2 (or TP) parameters are DTensors; SGD with fused=True calls
aten._fused_sgd_ on their lists, and DTensor's dispatch raises "Operator
aten._fused_sgd_.default does not have a sharding strategy registered". DTensor registers
the fused Adam/AdamW kernels as list-pointwise ops (torch/distributed/tensor/_ops/
_pointwise_ops.py `fused_ops`), not fused SGD (nor fused Adagrad); the same list in 2.13.0
and in pytorch main (2026-12). Found by suites/test_scenarios.py's `fsdp-eager-opt_fused`
row (torch 2.13.0 CPU, gloo, fixes off and on, 2026-12-04). The per-parameter loop and
AdamW(fused=True) over the same DTensor are the controls; each must step the local shard
exactly as the plain optimizer steps the full tensor.
"""

from __future__ import annotations

import pytest
import torch

from ..probes.capabilities import optimizer_impl
from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
              "adamw": (torch.optim.AdamW, {"lr": 1e-2})}


@pytest.mark.world_size(2)
@pytest.mark.parametrize("optim,impl", [("sgd", "fused"), ("sgd", "for_loop"), ("adamw", "fused")])
def test_optimizer_steps_a_sharded_dtensor(dist, optim: str, impl: str) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    why = optimizer_impl(dist.device_type, optim, impl)
    if why:
        pytest.skip(why)
    cls, kwargs = OPTIMIZERS[optim]
    options = {"fused": True} if impl == "fused" else {"foreach": False}
    full = torch.arange(8, dtype=torch.float32, device=dist.device).reshape(4, 2) / 8
    grad = torch.ones_like(full) / 4
    plain = torch.nn.Parameter(full.clone())
    plain.grad = grad.clone()
    cls([plain], **kwargs, foreach=False).step()

    mesh = dist.mesh()
    sharded = torch.nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)]))
    sharded.grad = distribute_tensor(grad.clone(), mesh, [Shard(0)])
    cls([sharded], **kwargs, **options).step()
    torch.testing.assert_close(sharded.full_tensor(), plain.detach())
