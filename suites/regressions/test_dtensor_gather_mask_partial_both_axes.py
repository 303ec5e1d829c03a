"""DTensor gather over a dim sharded on both axes of a 2-D mesh: the result's placements are
(_MaskPartial, _MaskPartial), the ranks raise different errors ("MaskBuffer has been
materialized with conflicting data" on some, "index 3 is out of bounds for dimension 1 with
size 2" on another) and the last one goes on into full_tensor(): in a job, a hang.

Trigger: `x.gather(1, index)` on a 2x2 mesh with x (Shard(1), Shard(1)); a Partial(sum) input
on one axis (the ops generator's `gather~2x2~f32~1x8,1x1~R.Psum,R.R~-~770`, seed
2026-12-07-night) is redistributed to that layout by the strategy and fails alike. One
_MaskPartial per mesh axis shares one MaskBuffer, which holds one mask. The control shards the
dim on one axis only (Replicate(), Shard(1)): one _MaskPartial, right. Standalone (torchrun, 4
gloo ranks) on torch 2.13.0 and 2.15.0: both raise, the control and a 1-D mesh are right. No
upstream issue found (searched 2026-12-07; #160697 and #130725 are other MaskBuffer faces).
Draft: reports/upstream-draft-dtensor-gather-mask-partial-both-axes.md.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("layout", ["gather_dim_on_both_axes", "gather_dim_on_one_axis_control"])
def test_a_gather_over_a_sharded_dim_equals_the_plain_op(dist, layout: str) -> None:
    import torch.distributed as tdist
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = dist.mesh((2, 2), ("dp_shard", "tp"))
    x, index = torch.randn(1, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([[3]])
    places = [Shard(1), Shard(1)] if layout.endswith("both_axes") else [Replicate(), Shard(1)]
    error = None
    try:  # the local gathers issue no collective: every rank reaches the agreement below
        out = distribute_tensor(x, mesh, places).gather(1, distribute_tensor(index, mesh, [Replicate()] * 2))
    except (RuntimeError, IndexError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    raised = torch.tensor([int(error is not None)])
    tdist.all_reduce(raised)
    if raised.item():
        pytest.fail(f"gather over dim 1 placed {places}: {int(raised.item())} of 4 ranks raised "
                    f"(here: {error or 'none, this rank went on'})")
    torch.testing.assert_close(out.full_tensor(), x.gather(1, index))
