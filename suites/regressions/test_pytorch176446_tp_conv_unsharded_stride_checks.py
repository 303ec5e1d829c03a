"""DTensor conv2d with no spatial sharding refuses an overlapping convolution (pytorch#176446).

Trigger: `F.conv2d(x, w, b, stride=1)` with a 2x2 kernel and no padding (a CNN stem or any conv
whose windows overlap: not a patch embedding) on a replicated or batch-sharded DTensor input
with replicated weights. Nothing needs a halo exchange, yet torch 2.11's `tp_convolution` (and
its backward) asserts `_is_supported` before asking `_requires_data_exchange`, and the spatial
rule for halo exchange ("It requires that input_size[-1] is divisible by stride[-1] and
stride[-1] equals kernel_size[-1] when there is padding for tensor parallel convolution") raises
on every rank. Upstream moved the check past the early return (PR #176448, in 2.13.0:
torch/distributed/tensor/_tp_conv.py). The patch conv (stride = kernel = 2) is the control.
Found by the ops generator on torch 2.11.0 (seed 2026-12-09-t211) as
`conv2d_patch~2~f32~3x5x2x6,7x5x2x2,7~S2,Pavg,Pavg~stride=1~3`, shrunk to
`conv2d_patch~2~f32~1x2x2,1x1x2x2,1~R,R,R~stride=1~0`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("stride", [1, 2], ids=["overlapping", "patch_control"])
@pytest.mark.parametrize("input_dim", [None, 0], ids=["replicated", "batch_sharded"])
def test_conv2d_without_spatial_sharding_matches_the_plain_op(dist, stride: int, input_dim: int | None) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 3, 4, 4, generator=gen), torch.randn(5, 3, 2, 2, generator=gen), torch.randn(5, generator=gen)
    mesh = dist.mesh()
    rep = [Replicate()]
    xd = distribute_tensor(x.to(dist.device), mesh, rep if input_dim is None else [Shard(input_dim)])
    try:
        out = F.conv2d(xd, distribute_tensor(w.to(dist.device), mesh, rep),
                       distribute_tensor(b.to(dist.device), mesh, rep), stride=stride)
    except RuntimeError as exc:
        pytest.fail(f"conv2d (stride {stride}) of a {'replicated' if input_dim is None else 'batch-sharded'} "
                    f"input raised: {str(exc).splitlines()[0]}")
    torch.testing.assert_close(out.full_tensor().cpu(), F.conv2d(x, w, b, stride=stride))
