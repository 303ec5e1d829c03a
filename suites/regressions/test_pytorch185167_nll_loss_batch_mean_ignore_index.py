"""cross_entropy(reduction="mean") over a batch-sharded DTensor with ignored targets (2 ranks).

Trigger: every LM loss pads with ignore_index=-100 (torchtitan's cross_entropy_loss,
torchtune's CEWithChunkedOutputLoss, HF's LabelSmoother) and averages over the targets
that count. On logits sharded on the batch dim (Shard(0)), DTensor's nll_loss strategy
returns Partial(avg) of each shard's own mean: the average of per-shard means, which is
the global mean only when every shard counts the same number of targets. With 3 of the
first shard's 4 rows ignored, torch 2.13.0 gives 2.4236 where the full tensor gives 1.8714
(CPU, gloo, 2026-12-06). reduction="sum" is right (Partial(sum) of sums), and so is
"mean" when no target is ignored: the controls. Upstream: pytorch#185167 reports the same
averaging with class weights; its fix's review (pytorch#179203) names ignore_index.
Found by the ops generator (distci fuzz --generator ops, seed 2026-12-06), shrunk to
`cross_entropy~2~f32~8x2,8~S0,R~reduction=mean,label_smoothing=0.0~205`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("reduction, ignored", [("mean", 3), ("mean", 0), ("sum", 3)],
                         ids=["mean-ignored_on_one_shard", "mean-none_ignored", "sum-ignored_on_one_shard"])
def test_batch_sharded_cross_entropy_mean(dist, reduction: str, ignored: int) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = dist.mesh()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 5, generator=gen)
    target = torch.randint(0, 5, (8,), generator=gen)
    target[:ignored] = -100  # the first shard's rows only: the shards count different targets
    ref = F.cross_entropy(logits, target, ignore_index=-100, reduction=reduction)
    got = F.cross_entropy(distribute_tensor(logits.to(dist.device), mesh, [Shard(0)]),
                          distribute_tensor(target.to(dist.device), mesh, [Replicate()]),
                          ignore_index=-100, reduction=reduction).full_tensor()
    assert torch.allclose(got.cpu(), ref, rtol=1e-5), (
        f"cross_entropy {reduction} over a batch-sharded DTensor with ignored targets: {float(got):.6g}, "
        f"the full tensor gives {float(ref):.6g}")
