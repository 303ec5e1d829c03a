"""conv2d of an input whose batch dim is sharded on both axes of a 2-D mesh raises (4 ranks).

Trigger: a patch-embedding conv (ViT / CLIP / SigLIP: `nn.Conv2d(kernel_size=patch,
stride=patch)`) under HSDP or any 2-D data-parallel mesh, where the batch is sharded over both
axes (dp_replicate x dp_shard) and the weights are replicated (gathered). DTensor's conv rule
(`convolution_rules` in torch/distributed/tensor/_ops/_conv_ops.py) reads the input's `dim_map`,
which cannot say "one dim sharded on two mesh axes", and raises: "Tensor dim 0 is already sharded
on mesh dim 0, DTensor operator implementation does not support things like hybrid sharding
strategies yet (i.e. [Shard(0), Shard(0)])". The batch sharded on one axis is right (the control),
and F.linear on the doubly sharded input works. torch 2.13.0 and 2.15.0 (CPU, gloo, 2026-12-06).
Found by the ops generator's conv-only run (distci fuzz --generator ops --ops conv2d_patch, seed
reach) as `conv2d_patch~2x2~f32~4x1x2x2,1x1x2x2,1~S0.S0,R.R,R.R~stride=2~0`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.parametrize("axes", [2, 1], ids=["batch_on_both_axes", "batch_on_one_axis"])
def test_patch_conv_of_a_batch_sharded_input(dist, axes: int) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(4, 3, 4, 4, generator=g), torch.randn(5, 3, 2, 2, generator=g), torch.randn(5, generator=g)
    mesh = dist.mesh((2, 2), ("dp_replicate", "dp_shard"))
    rep = [Replicate(), Replicate()]
    x_placed = distribute_tensor(x.to(dist.device), mesh, [Shard(0), Shard(0) if axes == 2 else Replicate()])
    try:
        out = F.conv2d(x_placed, distribute_tensor(w.to(dist.device), mesh, rep),
                       distribute_tensor(b.to(dist.device), mesh, rep), stride=2)
    except ValueError as exc:
        raise AssertionError(f"conv2d of an input whose batch is sharded on both mesh axes raised: "
                             f"{str(exc).splitlines()[0]}") from None
    assert torch.allclose(out.full_tensor().cpu(), F.conv2d(x, w, b, stride=2), atol=1e-5)
