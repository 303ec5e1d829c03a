"""DTensor: the backward of torch.cumprod raises (2 ranks).

Trigger: a cumulative product of a DTensor that requires grad (diffusers' alphas_cumprod is one;
decay products of linear-attention / SSM variants run it on activations), on any placement: the
forward runs, the backward raises "aten.where.self got mixed torch.Tensor and DTensor":
`cumprod_backward` (torch/csrc/autograd/FunctionsManual.cpp) allocates a plain tensor beside the
DTensor gradient. Upstream: pytorch#185362 (cumprod, cummax, cummin), fixed by PR pytorch#185228;
torch 2.13.0 still raises (CPU, gloo, 2026-12-07). Control: the same program on a replicated
input read back as a plain tensor first (`full_tensor()`), which differentiates.

Found by the ops generator's second inventory round (reports/fuzz-ops-2026-12-10-inventory2.md),
`cumprod~2~f32~3x2x3~S-3~dim=1~413` and its shrunk form.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("layout", ["sharded", "plain_control"])
def test_cumprod_backward_of_a_dtensor(dist, layout: str) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.arange(1.0, 9.0).reshape(4, 2) / 4
    ref = full.clone().requires_grad_()
    torch.cumprod(ref, dim=1).sum().backward()
    x = distribute_tensor(full.to(dist.device), dist.mesh(), [Shard(0)]).requires_grad_()
    y = x.full_tensor() if layout == "plain_control" else x
    try:
        torch.cumprod(y, dim=1).sum().backward()
    except RuntimeError as exc:
        pytest.fail(f"the backward of cumprod over a {x.placements} DTensor raised: {exc}")
    torch.testing.assert_close(x.grad.full_tensor().cpu(), ref.grad)
