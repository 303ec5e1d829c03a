"""DTensor index_select with a sharded index: its backward raises in index_add_ (torch 2.11;
2.13.0 right).

Trigger: `torch.index_select(x, 0, idx)` with x replicated and idx a DTensor `Shard(0)` (token ids
or expert ids split over the ranks: a row gather whose index is sharded like the batch), then
`backward`. Torch 2.11 propagates the backward's `index_add_` with the full index against the
local gradient's rows and every rank raises "index_add_(): Number of indices (4) should be equal
to source.size(dim): (2), for dim: 0". Torch 2.13.0 computes it. Found by the ops generator on
torch 2.11.0 (seed 2026-12-09-t211), shrunk to `index_select~2~f32~2x1,2~R,S0~-~0`; measured for
(2, 1), (3, 2) and (4, 3) inputs. Control: the replicated index, right on both.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks
from .conftest import raised_on_ranks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("index", ["sharded_index", "replicated_index_control"])
def test_index_select_gradient_matches_the_plain_op(dist, index: str) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    idx = torch.tensor([1, 0, 3, 1])
    want = x.clone().requires_grad_()
    torch.index_select(want, 0, idx).square().sum().backward()
    mesh = dist.mesh()
    xd = distribute_tensor(x.to(dist.device), mesh, [Replicate()]).requires_grad_()
    idx_d = distribute_tensor(idx.to(dist.device), mesh, [Shard(0) if index == "sharded_index" else Replicate()])
    failed = raised_on_ranks(dist, lambda: torch.index_select(xd, 0, idx_d).square().sum().backward())
    assert not failed, f"the backward of index_select with a {index.replace('_', ' ')} raised: {failed[0][1]}"
    torch.testing.assert_close(xd.grad.full_tensor().cpu(), want.grad)
