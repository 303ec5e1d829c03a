"""torch.cumsum over a sharded dim written as a negative dim (2 ranks).

Trigger: a cumulative sum along the dim a DTensor is sharded on, the dim written from the
end as model code writes it (`x.cumsum(dim=-1)`: position ids from an attention mask,
MoE offsets over the last dim). DTensor's cumsum strategy (pytorch#151071) replicates the
summed dim when it is sharded; written as -1 it is not recognized, each shard sums on its
own, and every element past the first shard misses the shards before it: torch 2.13.0
returns [[x0, x1]] cumsummed per shard (CPU, gloo, 2026-12-06). The same call with the
dim written as 1 is right: the control.
Found by the ops generator (distci fuzz --generator ops, seed 2026-12-06), shrunk to
`cumsum~2~f32~1x2~S1~dim=-1~0`.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("dim", [-1, 1], ids=["dim_negative", "dim_positive"])
def test_cumsum_over_the_sharded_dim(dist, dim: int) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.arange(1.0, 9.0).reshape(2, 4)
    got = torch.cumsum(distribute_tensor(full.to(dist.device), dist.mesh(), [Shard(1)]), dim=dim).full_tensor()
    ref = torch.cumsum(full, dim=dim)
    assert torch.equal(got.cpu(), ref), (
        f"cumsum over a sharded dim written as {dim}: {got.cpu().tolist()}, the full tensor gives {ref.tolist()}")
