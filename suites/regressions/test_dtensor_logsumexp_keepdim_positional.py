"""DTensor: torch.logsumexp(x, dim, keepdim=True) labels its result as if keepdim were False (2 ranks).

Trigger: a logsumexp over a dim before the one a DTensor is sharded on, with keepdim=True (the
manual log-softmax `x - x.logsumexp(dim, keepdim=True)`, router z-losses over the token dim of an
activation sharded on hidden or experts). `logsumexp_strategy` (torch/distributed/tensor/_ops/
_math_ops.py, from PR pytorch#163879) reads keepdim from the op's kwargs, but the dispatcher hands
`aten.logsumexp.default` keepdim as a positional argument: the rule always reduces as keepdim=False
and shifts the shard down one dim. The result keeps the input's local shards on dim 2 but says
Shard(1): its full_tensor() has the wrong shape and values, and a rank with an empty shard issues
collectives its peers do not (the ops generator saw a deadlock, "narrow unexpectedly changed
concrete size" and size mismatches in the backward). Torch 2.13.0 (CPU, gloo, 2026-12-07).
Control: keepdim=False, which the rule gets right. No upstream issue found (searched: DTensor
logsumexp keepdim); draft: reports/upstream-draft-dtensor-logsumexp-keepdim.md.

Found by the ops generator's second inventory round (reports/fuzz-ops-2026-12-10-inventory2.md),
`logsumexp~2~f32~2x1x1~S2~dim=0,keepdim=1,then=z_loss~445`.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("keepdim", [True, False], ids=["keepdim", "no_keepdim_control"])
def test_logsumexp_before_the_sharded_dim(dist, keepdim: bool) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.arange(24.0).reshape(2, 3, 4) / 10
    ref = torch.logsumexp(full, dim=0, keepdim=keepdim)
    got = torch.logsumexp(distribute_tensor(full.to(dist.device), dist.mesh(), [Shard(2)]), dim=0, keepdim=keepdim)
    want = Shard(2 if keepdim else 1)
    assert got.placements == (want,), (
        f"logsumexp(dim=0, keepdim={keepdim}) of a Shard(2) input says {got.placements}, its shards lie on "
        f"dim {want.dim} ({tuple(got.to_local().shape)} of {tuple(got.shape)})")
    torch.testing.assert_close(got.full_tensor().cpu(), ref)
