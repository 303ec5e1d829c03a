"""sum(dim=[]) of a sharded DTensor: the empty dim list (all dims) taken as no dim (2 ranks).

Trigger: `torch.linalg.vector_norm(x, inf)` over all dims of a sharded DTensor, then its
backward: autograd's formula for the inf-norm counts the maxima with `mask.sum(dim, True)`,
where `dim` is `[]` for a reduction over every dim, and in aten `sum(dim=[])` sums every
dim. DTensor's reduction strategy (`_infer_reduction_dims` in
torch/distributed/tensor/_ops/_math_ops.py) reads `[]` as "no dim": the count stays sharded,
each rank divides by its own count of maxima, and the gradient comes back NaN on every
element and -inf at the maximum (torch 2.13.0 and 2.15.0, CPU, gloo, 2026-12-06): the full
tensor gives 0 everywhere and -1 at the maximum. `x.sum([], keepdim=True)` itself returns
the shards' sums laid side by side (1.2 where the full sum is -0.3); keepdim=False a 0-dim
tensor still marked Shard(1), which `full_tensor()` cannot read (IndexError).
The control: the same inf-norm gradient on a replicated input.
Found by the ops generator (distci fuzz --generator ops, seed bench) as
`vector_norm~2~f32~1x4~S1~ord=inf,dim=none,keepdim=0~0` ("gradient of input 0: NaN").
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("placement", ["shard", "replicate"], ids=["sharded_input", "replicated_input"])
def test_inf_norm_gradient_over_all_dims(dist, placement: str) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    full = torch.tensor([[1.5, -0.3, -2.0, 0.5]])
    ref = full.clone().requires_grad_()
    torch.linalg.vector_norm(ref, float("inf")).backward()
    x = distribute_tensor(full.to(dist.device), dist.mesh(), [Shard(1) if placement == "shard" else Replicate()])
    x.requires_grad_()
    torch.linalg.vector_norm(x, float("inf")).full_tensor().backward()
    got = x.grad.full_tensor().cpu()
    assert torch.equal(got, ref.grad), (
        f"the inf-norm gradient of a {placement}d DTensor: {got.tolist()}, the full tensor gives {ref.grad.tolist()} "
        "(sum(dim=[]) of a sharded DTensor, all dims, taken as no dim)")
