"""DTensor stack along a new last dim of inputs sharded on their last dim returns a DTensor
whose placements name the wrong dim (torch 2.11; 2.13.0 right).

Trigger: `torch.stack([a, b], dim=-1)` where an input is `Shard(1)` of a (M, N) tensor (rotary
embeddings stacking cos / sin parts on a TP-sharded head dim, any `stack(..., -1)` of sharded
activations). Torch 2.11 labels the result `Shard(2)`, the new stacked dim, while each rank holds
its columns of dim 1 and both stacked entries: the promise (M, N, 1) against the held (M, N/2, 2);
reading it all-gathers mismatched sizes (gloo hangs). Torch 2.13.0 returns `Shard(1)`. Found by the
ops generator on torch 2.11.0 (seed 2026-12-09-t211) as
`stack~2x2~f32~3x1,3x1~R.S-1,S-1.S-1~dim=-1~487`, shrunk to `stack~2~f32~1x1,1x1~R,S1~dim=-1~0`;
measured for (R, S1), (S1, R) and (S1, S1) at sizes 1x1 to 4x4 (all wrong on 2.11, right on 2.13).
Control: stacking inputs sharded on dim 0 (the result's dim 0 too), right on both.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks
from ..generators.ops_checks import expected_local_shape

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("dim", [1, 0], ids=["last_dim_sharded", "first_dim_sharded_control"])
def test_stack_on_a_new_last_dim_matches_the_plain_op(dist, dim: int) -> None:
    import torch.distributed as tdist
    from torch.distributed.tensor import Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
    mesh = dist.mesh()
    out = torch.stack([distribute_tensor(t.to(dist.device), mesh, [Shard(dim)]) for t in (a, b)], dim=-1)
    held, says = tuple(out.to_local().shape), expected_local_shape(tuple(out.shape), out.placements, out.device_mesh)
    problems: list = [None] * dist.world_size
    tdist.all_gather_object(problems, None if held == says else f"rank {dist.rank} holds {held}")
    wrong = [p for p in problems if p]
    assert not wrong, (f"stack(dim=-1) of inputs sharded on dim {dim}: the result's placements {out.placements} "
                       f"of {tuple(out.shape)} say {says}; {', '.join(wrong)}")
    torch.testing.assert_close(out.full_tensor().cpu(), torch.stack([a, b], dim=-1))
