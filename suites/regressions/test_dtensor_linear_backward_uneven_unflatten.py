"""F.linear on a 3-D input: the backward refuses its own gradient layout (4 ranks, 2x2 mesh).

Trigger: F.linear with a (5, 2, 2) input replicated on a (dp_shard, tp) mesh, the weight
sharded on its input dim on dp_shard and the bias on dp_shard (as a per-layer
`shard_placement_fn` of FSDP2 lays parameters out). The forward is right. In the backward
DTensor gives the (10, 2) gradient of the flattened input Shard(0) on tp, a mesh axis the
forward never sharded, then refuses to unflatten it back to (5, 2, 2): "Cannot unflatten
unevenly sharded tensor: output dimension 0 (size 5) is not evenly divisible by mesh
dimension 1 (size 2). Please redistribute the tensor before this operation." The user
cannot redistribute inside autograd. torch 2.13.0 and 2.15.0 (CPU, gloo, 2026-12-06).
The control: a leading dim of 6 (the same layout, divisible).
Found by the ops generator (distci fuzz --generator ops, seed bench) as
`linear~2x2~f32~5x12x8,11x8,11~R.Pavg,S-1.R,S0.Pavg~bias=1~729`, shrunk to
`linear~2x2~f32~5x2x2,2x2,2~R.R,S1.R,S0.R~bias=1~0`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.parametrize("batch", [5, 6], ids=["uneven_batch", "even_batch"])
def test_linear_backward_of_a_3d_input(dist, batch: int) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(batch, 2, 2, generator=g), torch.randn(2, 2, generator=g), torch.randn(2, generator=g)
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    F.linear(*ref).sum().backward()
    mesh = dist.mesh((2, 2), ("dp_shard", "tp"))
    placed = [distribute_tensor(t.to(dist.device), mesh, p).requires_grad_()
              for t, p in zip((x, w, b), ([Replicate(), Replicate()], [Shard(1), Replicate()], [Shard(0), Replicate()]))]
    out = F.linear(*placed).full_tensor()
    try:
        out.sum().backward()
    except RuntimeError as exc:
        raise AssertionError(f"F.linear's backward refused its own gradient layout: {str(exc).splitlines()[0]}") from None
    for name, d, r in zip(("input", "weight", "bias"), placed, ref):
        got = d.grad.full_tensor().cpu()
        assert torch.allclose(got, r.grad, atol=1e-5), f"gradient of the {name}: {got.tolist()} vs {r.grad.tolist()}"
