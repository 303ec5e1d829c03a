"""DTensor argmax over the sharded dim raises "shape '[...]' is invalid for input of size N".

Trigger: `torch.argmax(x, dim=-1)` on a (1, 2) DTensor sharded on that dim over 2 ranks (a
batch of one, greedy decoding or an accuracy metric over vocab-parallel logits). On torch
2.13.0 every rank raises "shape '[1, 2, 2, 1]' is invalid for input of size 2" in DTensor's
argmax path (3x2 and 3x4 pass there: the leading dim of 1 matters); on 2.15.0 it returns the
full-tensor answer. Every rank raises alike, so in a job it is an error, not a hang. Found by the ops generator as
`argmax~2~f32~1x2~S-1~dim=-1~671` (seed 2026-12-06-night, torch 2.13.0 CPU, fixes off; the
generated report labelled it a near miss of dtensor-max-empty-shard, wrongly: no shard is
empty). Upstream: DTensor's argmax/argmin over sharded dims were rewritten by pytorch PRs
#168983 and #173936; 2.15.0 carries the fix. Control: the same op over the unsharded dim.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("dim", [-1, 0], ids=["sharded_dim", "other_dim_control"])
def test_argmax_matches_the_full_tensor(dist, dim: int) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    x = torch.randn(1, 2, generator=torch.Generator().manual_seed(0))
    sharded = distribute_tensor(x, dist.mesh(), [Shard(1)])
    try:
        got = torch.argmax(sharded, dim=dim).full_tensor()
    except RuntimeError as exc:
        pytest.fail(f"argmax(dim={dim}) of a DTensor sharded on dim 1 raised: {exc}")
    assert torch.equal(got, torch.argmax(x, dim=dim)), f"argmax(dim={dim}): {got.tolist()} vs {torch.argmax(x, dim=dim).tolist()}"
