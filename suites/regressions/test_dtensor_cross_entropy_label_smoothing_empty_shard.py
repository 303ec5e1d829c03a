"""DTensor cross_entropy with label_smoothing raises when a rank's batch shard is empty.

Trigger: `F.cross_entropy(logits, target, label_smoothing=0.1)` where the logits are sharded on
the batch dim over more ranks than the batch has rows (the last, smaller batch of an epoch or
an eval batch of one under data parallelism on a 2-D mesh). Without label smoothing the same
call is right; with it, the smoothing term's decomposition fills a mask in place and DTensor
refuses: "aten.masked_fill_.Scalar: in-place operations that require placement changes are not
supported". A batch of 3 over 2 ranks (uneven, no empty shard) passes: the control. Found by the
ops generator as `cross_entropy~2x2~bf16~1x7,1~S1.S0,S0.R~reduction=sum,label_smoothing=0.1~946`,
shrunk to `cross_entropy~2x2~f32~1x1,1~R.S0,R.R~reduction=sum,label_smoothing=0.1~0` (seed bench,
torch 2.13.0 CPU, fixes off, 2026-12-06); standalone the same on 2.15.0.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("batch", [1, 3], ids=["empty_shard", "uneven_control"])
def test_label_smoothed_loss_matches_the_full_tensor(dist, batch: int) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(batch, 5, generator=g), torch.randint(0, 5, (batch,), generator=g)
    mesh = dist.mesh()
    try:
        got = F.cross_entropy(distribute_tensor(logits, mesh, [Shard(0)]), distribute_tensor(target, mesh, [Replicate()]),
                              reduction="sum", label_smoothing=0.1).full_tensor()
    except RuntimeError as exc:
        pytest.fail(f"label-smoothed cross_entropy of a batch of {batch} over 2 ranks raised: {exc}")
    want = F.cross_entropy(logits, target, reduction="sum", label_smoothing=0.1)
    torch.testing.assert_close(got.cpu(), want)
