"""DTensor index_put (`out[rows, :] = values`) backward raises when the written tensor needs a gradient.

Trigger: an indexed assignment into a DTensor activation that requires grad (a masked-prediction
model's `x[mask_rows] = mask_token`, MoE unpermute code writing into an activation). The
backward of index_put computes the written tensor's gradient as
`grad.index_put(indices, values.zeros())`, where `values.zeros()` is built from saved metadata
as a plain tensor: DTensor raises "aten.index_put.default got mixed torch.Tensor and DTensor".
Upstream: pytorch#118461 (open since 2024-01). Fails on torch 2.13.0 and 2.15.0 (CPU, gloo),
every placement of the values. torchtitan's own `_unpermute` writes into `new_empty`, which
needs no gradient, and passes (the control). Found by the ops generator's `index_put` entry
(reports/fuzz-ops-2026-12-07-redteam.md).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("base", ["activation", "new_empty_control"])
def test_index_put_backward_matches_the_plain_op(dist, base: str) -> None:
    from torch.distributed.tensor import Replicate, distribute_tensor

    g = torch.Generator().manual_seed(0)
    full, values, rows = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g), torch.randperm(6, generator=g)
    mesh = dist.mesh()

    def write(x, v, r):
        out = x.clone() if base == "activation" else v.new_empty(x.shape)
        out[r, :] = v
        return out

    ref_x, ref_v = full.clone().requires_grad_(base == "activation"), values.clone().requires_grad_()
    write(ref_x, ref_v, rows).sum().backward()
    xd = distribute_tensor(full, mesh, [Replicate()]).requires_grad_(base == "activation")
    vd = distribute_tensor(values, mesh, [Replicate()]).requires_grad_()
    out = write(xd, vd, distribute_tensor(rows, mesh, [Replicate()]))
    try:
        out.sum().backward()
    except RuntimeError as exc:
        pytest.fail(f"index_put backward ({base}) raised: {exc}")
    torch.testing.assert_close(vd.grad.full_tensor(), ref_v.grad)
    if base == "activation":
        torch.testing.assert_close(xd.grad.full_tensor(), ref_x.grad)
