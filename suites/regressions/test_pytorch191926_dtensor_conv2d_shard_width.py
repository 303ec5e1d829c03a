"""DTensor conv2d of an input sharded on its width returns a DTensor whose placements do not
describe what the ranks hold (pytorch#191926); the convolution rule's whole family (it ignores
the weight's placements) is still there on 2.15.

Trigger: `F.conv2d(x, w, b, stride=s)` with x a DTensor `Shard(3)` (the width) and replicated
weights (kernel 2). Each rank convolves its own columns, and the result is labelled
`Replicate()` with the full output width: a silently wrong tensor (on torch 2.13.0 a later
`backward` raises "The size of tensor a (8) must match the size of tensor b (16)"). Upstream's
report (a 2.13 regression from 2.12's `convolution_backward_rules`) is closed: on torch 2.15.0
the non-overlapping patch conv (stride = kernel = 2) is right, the overlapping one (stride 1:
every window across the shard boundary is lost) still claims `Replicate()` of width 7 while the
ranks hold width 3. Where trainers meet it: the patch embedding of ViT / CLIP / SigLIP vision
towers (`nn.Conv2d(kernel_size=patch, stride=patch)`), and any CNN stem, under spatial (width)
sharding. The ops generator draws both as `conv2d_patch~2~f32~2x3x4x8,5x3x2x2,5~S3,R,R~stride=2~0`
(and `stride=1`). A row-wise conv (input and weight sharded on the in-channels, Megatron's
RowwiseParallel written for a conv) comes back `Replicate()` without the sum over the ranks:
`convolution_rules` returns the input's dim map and never reads the weight's placements
(dtensor-conv2d-placements-ignored). Control: the same convs with the input sharded on the
batch dim and replicated weights.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import tier_marks
from ..generators.ops_checks import expected_local_shape

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("dim,stride,weight_dim", [(3, 2, None), (3, 1, None), (1, 2, 1), (0, 2, None), (0, 1, None)],
                         ids=["width_sharded_patch", "width_sharded_overlap", "channel_sharded_weight_rowwise",
                              "batch_sharded_patch_control", "batch_sharded_overlap_control"])
def test_conv2d_matches_the_plain_op(dist, dim: int, stride: int, weight_dim: int | None) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 4, 4, 8, generator=gen), torch.randn(5, 4, 2, 2, generator=gen), torch.randn(5, generator=gen)
    mesh = dist.mesh()
    xd = distribute_tensor(x, mesh, [Shard(dim)]).requires_grad_()
    wd = distribute_tensor(w, mesh, [Replicate() if weight_dim is None else Shard(weight_dim)]).requires_grad_()
    bd = distribute_tensor(b, mesh, [Replicate()]).requires_grad_()
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    want = F.conv2d(xr, wr, br, stride=stride)
    want.sum().backward()
    out = F.conv2d(xd, wd, bd, stride=stride)
    held, says = tuple(out.to_local().shape), expected_local_shape(tuple(out.shape), out.placements, out.device_mesh)
    assert held == says, (f"conv2d of an input sharded on dim {dim} (stride {stride}): the output's placements "
                          f"{out.placements} of {tuple(out.shape)} say {says}, the rank holds {held}")
    off = (out.full_tensor() - want.detach()).abs().max().item()
    assert off <= 1e-4, (f"conv2d of an input sharded on dim {dim} (stride {stride}): the output's placements "
                         f"{out.placements} hold values off the plain op's by {off:.3g}")
    try:
        out.sum().backward()
    except RuntimeError as exc:
        pytest.fail(f"conv2d backward of an input sharded on dim {dim} raised: {exc}")
    torch.testing.assert_close(xd.grad.full_tensor(), xr.grad)
    torch.testing.assert_close(wd.grad.full_tensor(), wr.grad)
