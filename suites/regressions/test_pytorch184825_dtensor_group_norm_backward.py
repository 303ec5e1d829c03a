"""DTensor: the backward of F.group_norm on a batch-sharded input raises (2 ranks).

Trigger: diffusers' UNet blocks (ResnetBlock2D's nn.GroupNorm) under data-parallel DTensor
layouts, the input Shard(0) on the batch: the forward runs (native_group_norm has a strategy),
but native_group_norm_backward has none, so DTensor derives one from the op's decomposition
without rewriting its scalar N, C, HxW arguments to the local shard: the local kernel raises
"Expected dY.numel() == N * C * HxW to be true, but got false" (and with a 0-long spatial dim,
"float division by zero" in the propagation). Upstream: PR pytorch#184825 ("[DTensor] add
sharding strategy for group norm backward", open, 2026-05-21) registers that strategy and the
scalar adjuster; torch 2.13.0 raises (CPU, gloo, 2026-12-07). Control: the replicated input.

Found by the ops generator's second inventory round (reports/fuzz-ops-2026-12-10-inventory2.md).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("layout", ["batch_sharded", "replicated_control"])
def test_group_norm_backward_of_a_batch_sharded_input(dist, layout: str) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(4, 6, 3, generator=gen), torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    refs = [t.clone().requires_grad_() for t in (x, w, b)]
    F.group_norm(refs[0], 2, refs[1], refs[2]).sum().backward()
    mesh = dist.mesh()
    place = Shard(0) if layout == "batch_sharded" else Replicate()
    dx = distribute_tensor(x.to(dist.device), mesh, [place]).requires_grad_()
    dw, db = (distribute_tensor(t.to(dist.device), mesh, [Replicate()]).requires_grad_() for t in (w, b))
    try:
        F.group_norm(dx, 2, dw, db).sum().backward()
    except RuntimeError as exc:
        pytest.fail(f"the backward of group_norm over a {dx.placements} input raised: {exc}")
    for got, ref in zip((dx, dw, db), refs):
        torch.testing.assert_close(got.grad.full_tensor().cpu(), ref.grad)
