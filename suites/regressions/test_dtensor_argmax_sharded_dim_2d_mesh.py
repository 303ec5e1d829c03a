"""DTensor argmax over a dim sharded on the first axis of a 2-D mesh (torch 2.15): the result is
placed (Replicate(), Shard(0)) while every rank holds the whole (2,) answer, so full_tensor()
raises "narrow unexpectedly changed concrete size on dim 0: 4 -> 2".

Trigger: x (2, 7) placed (Shard(1), Replicate()) on a 2x2 mesh, x.argmax(dim=-1). torch 2.13.0
returns (Replicate(), Replicate()) and the plain op's answer (the control is the same call on a
1-D mesh). Found by the ops night run on 2.15.0 (seed 2026-12-07-night) as
`argmax~2x2~f32~2x7~S-1.R~dim=-1~0` ("output 0: local shape"); its empty-shard face
`argmax~2x2~f32~2x1~S-1.R~dim=-1~0` raised on the ranks holding no column. Standalone (torchrun, 4
gloo ranks, 2026-12-07): 2.15.0 wrong, 2.13.0 right. DTensor's argmax over sharded dims was
rewritten by pytorch PRs #168983 / #173936 (see dtensor-argmax-sharded-dim-batch-one, whose 2.13
face 2.15 fixed); not bisected.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("mesh_shape", ["sharded_dim_2d_mesh", "sharded_dim_1d_mesh_control"])
def test_argmax_over_the_sharded_dim_is_the_plain_op(dist, mesh_shape: str) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    x = torch.randn(2, 7, generator=torch.Generator().manual_seed(0))
    if mesh_shape.startswith("sharded_dim_2d"):
        out = distribute_tensor(x, dist.mesh((2, 2), ("dp_shard", "tp")), [Shard(1), Replicate()]).argmax(dim=-1)
    else:
        out = distribute_tensor(x, dist.mesh((4,), ("tp",)), [Shard(1)]).argmax(dim=-1)
    local = tuple(out.to_local().shape)
    try:
        got = out.full_tensor()
    except RuntimeError as exc:
        pytest.fail(f"argmax of a (2, 7) DTensor sharded on dim 1: placements {out.placements}, "
                    f"local {local}; full_tensor() raised: {exc}")
    torch.testing.assert_close(got, x.argmax(dim=-1))
