"""loss_parallel(): a rank whose class (vocab) shard is empty skips the max all-reduce of
log_softmax that the other ranks issue, so the ranks' collectives part ways (a hang on gloo; on
NCCL the other ranks' MAX pairs with its SUM).

Trigger: logits sharded on their class dim over a tp mesh where torch.chunk leaves a rank no
class (fewer classes than ranks, or 10 classes on 8 ranks: 2, 2, 2, 2, 2, 0, 0, 0), then
`F.log_softmax` (or `F.cross_entropy`, whose nll_loss then raises "index 0 is out of bounds for
dimension 1 with size 0" there) under `loss_parallel()`. torch/distributed/tensor/parallel/
loss.py `_log_softmax`: `if x.numel() == 0: shifted = x` skips `funcol.all_reduce(x_max, MAX)`.
The test counts each rank's all-reduces with the module's funcol replaced by a recorder (so no
rank waits), then compares them across ranks; the control has a class on every rank.
Standalone (torchrun, 2 gloo ranks, one class): rank 0 waits in its second all-reduce until the
timeout, torch 2.13.0 and 2.15.0. Found by the ops generator's loss-parallel entries (round 3,
2026-12-07: `lp_kl_div~2~f32~1x1,1x1~S-1,S-1~temperature=2.0~0`, "every rank waits in a
collective its peers never issue"). No upstream issue found (searched: loss_parallel empty shard,
uneven vocab, numel 0 all_reduce). Draft: reports/upstream-draft-loss-parallel-empty-class-shard.md.
"""

from __future__ import annotations

import types

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("classes", [1, 4], ids=["one_class_empty_shard", "four_classes_control"])
def test_every_rank_issues_the_same_collectives_under_loss_parallel(dist, classes: int, monkeypatch) -> None:
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss, loss_parallel

    mesh = dist.mesh()
    logits = distribute_tensor(torch.randn(3, classes, generator=torch.Generator().manual_seed(0)), mesh,
                               [Shard(-1)])
    issued: list[str] = []

    def all_reduce(tensor, reduceOp, group):  # noqa: N803 (funcol's own keyword)
        issued.append(str(reduceOp))
        return tensor

    monkeypatch.setattr(loss, "funcol", types.SimpleNamespace(all_reduce=all_reduce))
    with loss_parallel():
        F.log_softmax(logits, dim=-1)
    every: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(every, (tuple(logits.to_local().shape), issued))
    assert len({tuple(calls) for _, calls in every}) == 1, (
        f"log_softmax under loss_parallel() over {classes} class(es) on {len(every)} ranks: the ranks "
        f"issue different all-reduces (local shape, reductions): {every}")
