"""A view of a DTensor whose sharded dim has length 0 is refused, even one that keeps it (2 ranks).

Trigger: a per-row max (`x.amax(-1)`, as rowwise Float8 scaling and max-subtracting softmax
code write it) of an activation sharded on its batch dim when the batch is empty (an MoE
expert that got no token, the last microbatch of an epoch), then the backward: autograd
restores the reduced dim with `grad.view(0, 3, 1)`, and DTensor's view strategy refuses:
"This operation would remove or reshape sharded dimension 0, which requires redistribution.
Please redistribute the input first." The view keeps dim 0 as it is; with 2 rows the same
view and backward are right (the control). The user cannot redistribute inside autograd.
torch 2.13.0 and 2.15.0 (CPU, gloo, 2026-12-06).
Found by the ops generator (distci fuzz --generator ops, seed bench) as
`amax~2x2~f32~0x7x1~S0.R~dim=-1,keepdim=0~472`, shrunk to `amax~2~f32~0x1x1~S0~dim=-1,keepdim=0~0`.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("rows", [0, 2], ids=["empty_sharded_dim", "two_rows"])
def test_rowwise_amax_backward_of_a_batch_sharded_activation(dist, rows: int) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.randn(rows, 3, 4, generator=torch.Generator().manual_seed(0))
    ref = full.clone().requires_grad_()
    ref.amax(-1).sum().backward()
    x = distribute_tensor(full.to(dist.device), dist.mesh(), [Shard(0)]).requires_grad_()
    out = x.amax(-1).full_tensor()
    try:
        out.sum().backward()
    except RuntimeError as exc:
        raise AssertionError(f"the backward's view of an empty sharded dim was refused: {str(exc).splitlines()[0]}") from None
    assert torch.equal(x.grad.full_tensor().cpu(), ref.grad)
