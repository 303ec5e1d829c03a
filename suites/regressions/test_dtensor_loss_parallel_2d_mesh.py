"""loss_parallel() on a 2-D mesh refuses batch-sharded, class-sharded logits (torch 2.11; 2.13.0
computes them).

Trigger: cross entropy (or nll over log_softmax) under `loss_parallel()` on logits laid out
(Shard(0), Shard(-1)) over a ("dp", "tp") mesh: the batch on the data-parallel axis, the vocab on
the tensor-parallel axis, as a DTensor activation of a 2-D mesh arrives at the loss. Torch 2.11's
`_find_all_reduce_mesh_dim` accepts only a one-dimensional mesh and raises "Currently
loss_parallel() only supports input on one-dimensional DeviceMesh." on every rank; torch 2.13.0
takes any mesh with one axis sharding the class dim (pytorch PR #180936, "Make loss parallel
support multi-dimensional mesh"; `reduction='mean'` is still refused on a 2-D mesh there, by
name: a gap to the ops generator, hence `sum` here). Found by the ops generator on torch 2.11.0
(seed 2026-12-09-t211), shrunk to `lp_nll_log_softmax~2x2~f32~1x2,1~S0.S-1,S0.R~reduction=sum~0`.
Control: the same loss on the 1-D tp mesh.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.parametrize("mesh_dims", [2, 1], ids=["dp_tp_mesh", "tp_mesh_control"])
def test_loss_parallel_cross_entropy_matches_the_plain_loss(dist, mesh_dims: int) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    gen = torch.Generator().manual_seed(0)
    logits, target = torch.randn(4, 6, generator=gen), torch.randint(0, 6, (4,), generator=gen)
    want = logits.clone().requires_grad_()
    F.cross_entropy(want, target, reduction="sum").backward()
    mesh = dist.mesh((2, 2), ("dp", "tp"))
    if mesh_dims == 2:
        x = distribute_tensor(logits.to(dist.device), mesh, [Shard(0), Shard(1)]).requires_grad_()
        y = distribute_tensor(target.to(dist.device), mesh, [Shard(0), Replicate()])
    else:
        x = distribute_tensor(logits.to(dist.device), mesh["tp"], [Shard(1)]).requires_grad_()
        y = distribute_tensor(target.to(dist.device), mesh["tp"], [Replicate()])
    with loss_parallel():
        try:
            loss = F.cross_entropy(x, y, reduction="sum")
        except ValueError as exc:
            pytest.fail(f"loss_parallel() cross entropy on a {mesh_dims}-D mesh raised: {exc}")
        loss.backward()
    torch.testing.assert_close(loss.full_tensor().cpu(), F.cross_entropy(logits, target, reduction="sum"))
    torch.testing.assert_close(x.grad.full_tensor().cpu(), want.grad)
