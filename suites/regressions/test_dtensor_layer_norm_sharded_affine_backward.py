"""DTensor layer_norm with a sharded weight or bias: the backward raises "Expected bias to be of
same shape as normalized_shape" (torch 2.11; 2.13.0 right).

Trigger: `F.layer_norm(x, (D,), w, b)` with x replicated and the affine weight or bias a DTensor
`Shard(0)` (a LayerNorm's parameters sharded as FSDP2 or a TP plan leave them when the module runs
without gathering them), then `backward`. The forward is right; torch 2.11's backward strategy
hands the local shard to `native_layer_norm_backward` with the full normalized_shape and every
rank raises ("but got bias of shape [2] and normalized_shape = [4]"; for a sharded weight
"Expected weight to be of same shape"). Torch 2.13.0's single-dim layer_norm strategies
replicate them. Found by the ops generator on torch 2.11.0 (seed 2026-12-09-t211) as
`layer_norm~2~bf16~4x3,3,3~Psum,Pavg,S0~-~5`, shrunk to `layer_norm~2~f32~1x2,2,2~R,R,S0~-~0`;
measured for D = 2, 3 and 4. Control: replicated affine parameters.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import tier_marks
from .conftest import raised_on_ranks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("sharded", ["bias", "weight", "none_control"])
def test_layer_norm_gradients_match_the_plain_op(dist, sharded: str) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(3, 4, generator=gen), torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
    F.layer_norm(x, (4,), wr, br).square().sum().backward()
    mesh = dist.mesh()
    xd = distribute_tensor(x.to(dist.device), mesh, [Replicate()])
    wd, bd = (distribute_tensor(t.to(dist.device), mesh, [Shard(0) if sharded == name else Replicate()]).requires_grad_()
              for name, t in (("weight", w), ("bias", b)))
    failed = raised_on_ranks(dist, lambda: F.layer_norm(xd, (4,), wd, bd).square().sum().backward())
    assert not failed, f"the backward of layer_norm with a sharded {sharded} raised: {failed[0][1]}"
    torch.testing.assert_close(wd.grad.full_tensor().cpu(), wr.grad)
    torch.testing.assert_close(bd.grad.full_tensor().cpu(), br.grad)
