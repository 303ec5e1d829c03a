"""loss_parallel(): cross entropy with class weights over targets holding ignore_index raises in
its backward ("index -100 is out of bounds for dimension 1 with size N").

Trigger: `F.cross_entropy(logits, target, weight=w)` under `loss_parallel()` with vocab-sharded
logits, class weights (class-imbalance training, HF / torchtune `weight=`) and padded targets
(-100, the default ignore_index every trainer pads with), any reduction; then `backward()`.
torch/distributed/tensor/parallel/loss.py `_nll_loss_and_log_softmax_backward` gathers the
weight with `target` instead of the `safe_target` it computed a few lines above (the same slip
plain cross entropy had in pytorch#69339 / #91383, fixed there). The forward is right; targets
without -100 are right (the control). Standalone (torchrun, 2 gloo ranks), torch 2.13.0 and
2.15.0, reductions sum, mean and none. Found by the ops generator's `lp_cross_entropy` entry
(round 3, 2026-12-07, seed lp1: `lp_cross_entropy~2~f32~11x2,11,2~S-1,R,R~reduction=sum,
weight=1,label_smoothing=0.0~0`, "the backward raised RuntimeError: index -N is out of bounds").
No upstream issue names the loss-parallel face (searched 2026-12-07). Draft:
reports/upstream-draft-loss-parallel-weight-ignore-index.md.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("targets", [(0, -100, 2, 3), (0, 5, 2, 3)], ids=["padded_targets", "no_padding_control"])
def test_weighted_cross_entropy_under_loss_parallel_has_the_plain_gradient(dist, targets) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = dist.mesh()
    g = torch.Generator().manual_seed(0)
    x, w, y = torch.randn(4, 6, generator=g), torch.rand(6, generator=g) + 0.5, torch.tensor(targets)
    logits = distribute_tensor(x, mesh, [Shard(-1)]).requires_grad_()
    with loss_parallel():
        loss = F.cross_entropy(logits, distribute_tensor(y, mesh, [Replicate()]),
                               weight=distribute_tensor(w, mesh, [Replicate()]), reduction="sum")
        try:  # every rank gathers the same targets: all raise alike, none waits
            loss.backward()
        except RuntimeError as exc:
            pytest.fail(f"backward of weighted cross entropy under loss_parallel() with targets {targets}: "
                        f"{str(exc).splitlines()[0][:160]}")
    ref = x.clone().requires_grad_()
    F.cross_entropy(ref, y, weight=w, reduction="sum").backward()
    torch.testing.assert_close(logits.grad.full_tensor(), ref.grad)
