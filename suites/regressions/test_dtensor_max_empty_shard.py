"""A full max / amax of a DTensor whose shards are empty on some ranks (4 ranks).

Trigger: a tensor whose sharded dim is smaller than the mesh (a (1, N) parameter or
activation sharded on dim 0 over 4 ranks, as FSDP2 shards any parameter) reduced to one
value the way torchao's tensorwise Float8 scaling and clip code write it:
`torch.max(torch.abs(x))` / `torch.amax(x)` without a dim. DTensor runs the local op on
every shard and marks the result Partial(max); the ranks holding an empty shard raise
"max(): Expected reduction dim to be specified for input.numel() == 0" while the others
go on: in a job, the ranks part ways and hang at the next collective. torch 2.13.0 (CPU,
gloo, 2026-12-06): ranks 1-3 raise, rank 0 returns 2.0. The control: a (4, 2) tensor, one
row per rank, no empty shard.
Found by the ops generator (distci fuzz --generator ops, seed 2026-12-06) as a sweep that
died on `amax~4~f32~1x2~S-2~dim=none,keepdim=0~216`.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks
from .conftest import raised_on_ranks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.parametrize("rows", [1, 4], ids=["empty_shards", "no_empty_shard"])
def test_full_max_of_a_sharded_dtensor(dist, rows: int) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.arange(2.0 * rows).reshape(rows, 2) - 1.5
    x = distribute_tensor(full.to(dist.device), dist.mesh(), [Shard(0)])
    failed = raised_on_ranks(dist, lambda: torch.max(torch.abs(x)))  # no collective yet: Partial(max) until read
    assert not failed, f"a full max of a DTensor with empty shards raised on ranks {[r for r, _ in failed]} only: " \
                       f"{failed[0][1]}"


@pytest.mark.world_size(4)
@pytest.mark.parametrize("rows", [1, 4], ids=["empty_shards", "no_empty_shard"])
def test_inf_norm_of_sharded_gradients(dist, rows: int) -> None:
    """The same max through gradient clipping: `clip_grad_norm_(params, max_norm,
    norm_type=inf, foreach=True)` (torchtitan's clip_grad_norm_ on FSDP2 gradients) starts
    with `torch._foreach_norm(grads, inf)`, which raises "_foreach_norm cannot compute the
    infinity norm on an empty tensor" on the ranks holding an empty shard; the others go on
    into clip_grad_norm_'s own all-reduce and wait there (the bench's lost 4-rank slots,
    2026-12-06; checked on 2 ranks with the whole clip_grad_norm_: rank 0 held in the
    collective until rank 1 exited). Only the local step is run here, so no rank is left
    in a collective. torchrec filters empty gradients out before this call for the same
    error (meta-pytorch/torchrec#3809, #3891)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    grad = distribute_tensor((torch.arange(3.0 * rows).reshape(rows, 3) - 1.5).to(dist.device), dist.mesh(),
                             [Shard(0)])
    failed = raised_on_ranks(dist, lambda: torch._foreach_norm([grad], float("inf")))
    assert not failed, f"an inf norm of DTensor gradients with empty shards raised on ranks " \
                       f"{[r for r, _ in failed]} only: {failed[0][1]}"
