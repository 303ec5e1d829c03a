"""DTensor topk's backward raises "aten.scatter.src got mixed torch.Tensor and DTensor"
(pytorch#178582; torchtitan#2801 for MoE routing).

Trigger: `torch.topk(x, k).values` read by a loss, x a DTensor of any placement (an MoE router's
top-k gate weights under TP or on a DTensor activation). topk's backward
(`value_selecting_reduction_backward`) built its zeros with `at::zeros(sizes, grad.options())`, a
plain tensor, and scattered the DTensor gradient into it: every rank raises. Upstream fixed it
with `grad.new_zeros` (PR #178668, in 2.13.0). Found by the ops generator on torch 2.11.0 (seed
2026-12-09-t211) as `topk~2~f32~6x3~R~k=3,dim=-1~468` and `topk~4~f32~2x7~S-2~k=2,dim=0~190`,
shrunk to `topk~2~f32~1x2~R~k=1,dim=-1~0`. The control: the gradient through `gather` of the
same indices (what torchtitan's own MoE router does, and what works on 2.11).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("read", ["topk_values", "gather_control"])
@pytest.mark.parametrize("placement", ["replicated", "row_sharded"])
def test_the_gradient_of_topk_values_matches_the_plain_op(dist, read: str, placement: str) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    want = x.clone().requires_grad_()
    torch.topk(want, 2, dim=-1).values.square().sum().backward()
    xd = distribute_tensor(x.to(dist.device), dist.mesh(),
                           [Replicate() if placement == "replicated" else Shard(0)]).requires_grad_()
    if read == "topk_values":
        values = torch.topk(xd, 2, dim=-1).values
    else:
        values = torch.gather(xd, -1, torch.topk(xd.detach(), 2, dim=-1).indices)
    try:
        values.square().sum().backward()
    except RuntimeError as exc:
        pytest.fail(f"the backward of {read} on a {placement} DTensor raised: {str(exc).splitlines()[0]}")
    torch.testing.assert_close(xd.grad.full_tensor().cpu(), want.grad)
