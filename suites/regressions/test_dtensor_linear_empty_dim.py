"""DTensor linear/matmul of a 3-D input with a 0-length dim raises "integer modulo by zero".

Trigger: `F.linear(x, w)` (so any `nn.Linear` under tensor parallelism, and `torch.matmul`)
where x is a DTensor of shape (B, 0, D): an empty sequence or an empty group of tokens
reaching a tensor-parallel projection (a microbatch whose packed segment is empty, a
per-expert loop over (1, 0, D) token groups). The plain op returns a (B, 0, out) tensor.
DTensor's view strategy (`_view_ops.view_groups`, reached through matmul's fold and unfold
of the batch dims) divides by the product of the sizes, 0, and raises on every rank (an
error, not a hang). Found by the ops generator as `matmul~2~f32~6x0x4,4x4~R,S0~-~520`,
shrunk to `matmul~2~f32~2x0x1,1x1~R,R~-~0` (seed bench, torch 2.13.0 CPU, fixes off,
2026-12-06); the same on 2.15.0. Direct `reshape` / `view` / `flatten` of the same empty
DTensor work; the 2-D (0, D) input is the control. Searched pytorch issues (DTensor empty
view / reshape, the message): nothing for DTensor.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("shape", [(2, 0, 4), (0, 4)], ids=["empty_middle_dim", "two_dim_control"])
@pytest.mark.parametrize("weight", ["colwise", "replicated"])
def test_linear_of_an_empty_input_matches_the_plain_op(dist, shape, weight: str) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(*shape, generator=g), torch.randn(6, 4, generator=g)
    mesh = dist.mesh()
    xd = distribute_tensor(x, mesh, [Replicate()])
    wd = distribute_tensor(w, mesh, [Shard(0) if weight == "colwise" else Replicate()])
    try:
        got = F.linear(xd, wd).full_tensor()
    except RuntimeError as exc:
        pytest.fail(f"F.linear of a {tuple(shape)} DTensor ({weight} weight) raised: {exc}")
    assert tuple(got.shape) == tuple(F.linear(x, w).shape)
