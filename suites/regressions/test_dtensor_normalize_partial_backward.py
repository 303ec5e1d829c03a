"""DTensor: the backward of a 2-norm (F.normalize, vector_norm) of a Partial input raises.

Trigger: a DTensor matmul whose contraction dim is sharded (activations Shard(-1) times a
weight Shard(0): the row-wise half of tensor parallelism written in DTensor, as full-DTensor
models and SimpleFSDP-style code leave it) gives a Partial(sum) result; `F.normalize` of it
(L2-normalized embeddings of a contrastive loss, QK-norm by L2) runs forward (the norm
redistributes to Replicate), but its backward raises "aten.masked_fill_.Scalar: in-place
operations that require placement changes are not supported. The input has placement
(Partial(sum),)": `linalg_vector_norm_backward` scales the saved Partial input, then zeroes
the entries of zero norm in place with `masked_fill_(norm == 0, 0)`; DTensor lists
masked_fill_ as a plain pointwise op with no Partial rule, though filling with 0 under a
replicated mask keeps a Partial(sum) or Partial(avg) exact. Partial(avg) raises alike.
On torch 2.13.0 and 2.15.0 (CPU, gloo, 2026-12-06). Control: the same program after an
explicit redistribute to Replicate, which every rank then differentiates correctly.

Found by the ops generator as `vector_norm~2x2~f32~1x2~Pavg.S1~ord=2,dim=1,keepdim=0~0`
(seed 2026-12-06-night, both versions, fixes off). Upstream: pytorch#152249 (no sharding
strategy for masked_fill_ in torch.norm's backward, closed by registering it as pointwise)
and PR pytorch#159856 (norms of Partial DTensors) are neighbours; none for this face.
Draft: reports/upstream-draft-dtensor-normalize-partial-backward.md.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("layout", ["partial_input", "replicated_control"])
def test_normalize_of_a_rowwise_matmul_backward(dist, layout: str) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 4, generator=gen), torch.randn(4, 6, generator=gen)
    ref_x, ref_w = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.normalize(ref_x @ ref_w, dim=-1).pow(2).mul(torch.arange(6.0)).sum().backward()

    mesh = dist.mesh()
    dx = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
    dw = distribute_tensor(w, mesh, [Shard(0)]).requires_grad_()
    h = dx @ dw  # Partial(sum): the contraction dim is sharded
    if layout == "replicated_control":
        h = h.redistribute(mesh, [Replicate()])
    weights = distribute_tensor(torch.arange(6.0), mesh, [Replicate()])
    try:
        F.normalize(h, dim=-1).pow(2).mul(weights).sum().backward()
    except RuntimeError as exc:
        pytest.fail(f"backward of F.normalize over a {h.placements} DTensor raised: {exc}")
    torch.testing.assert_close(dx.grad.full_tensor(), ref_x.grad)
    torch.testing.assert_close(dw.grad.full_tensor(), ref_w.grad)
