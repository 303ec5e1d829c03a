"""DTensor's decomposition-derived sharding of the fused pointwise losses divides by each rank's
local element count: `F.mse_loss` / `smooth_l1_loss` / `huber_loss` / `binary_cross_entropy` /
`soft_margin_loss` with `reduction="mean"` on a sharded input give a gradient scaled by the
world size (even sharding), and a wrong loss where the mesh does not divide the sharded dim.
Also here: an empty input's backward raises "float division by zero" in DTensor's output-meta
propagation (mse_loss_backward's decomposition under FakeTensor; fake-mse-loss-backward-empty-zerodiv).

Trigger: the loss of a DTensor sharded on any dim (a batch-sharded prediction, a TP or CP
output kept as a DTensor), `reduction="mean"` (every loss's default), then `backward()`.
These ops have no registered strategy; since torch 2.13 DTensor derives one by tracing the
op's decomposition (torch/distributed/tensor/_decompositions.py) and then runs the fused ATen
op on each local shard with the derived placements. The forward's mean becomes `Partial(avg)`
of each shard's own mean (right only for equal shards: the DTensor.mean face of this was
pytorch#162692), and `mse_loss_backward` and its siblings compute `2 / input.numel()` from the
local shard, so every gradient element is multiplied by the number of shards. No error, no
warning: a regression head, a diffusion model's denoising loss (torchtitan's flux
`F.mse_loss(pred.float(), target.float())`) or a multi-label head trains with an N-times
learning rate (`binary_cross_entropy_with_logits`: the loss is off on uneven shards, its
gradient right). distci's fix `dtensor_decomp_loss_strategy` registers strategies for these
ops (replicate; elementwise for reduction="none"): fixes on, every case passes. `F.l1_loss` and `F.kl_div` (composite ops) are right, as is `reduction="sum"`:
the controls. Found by distci's ops generator (`pointwise_loss`, 2026-12-06); reproduced
standalone on torch 2.13.0 and 2.15.0 CPU with 2 gloo ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")

_LOSSES = {
    "mse": F.mse_loss,
    "smooth_l1": F.smooth_l1_loss,
    "huber": F.huber_loss,
    "bce": lambda a, b, reduction: F.binary_cross_entropy(a.sigmoid(), b.sigmoid(), reduction=reduction),
    "bce_logits": lambda a, b, reduction: F.binary_cross_entropy_with_logits(a, b.sigmoid(), reduction=reduction),
    "l1": F.l1_loss,
}


def _loss_and_grad(dist, loss: str, shape: tuple[int, ...], reduction: str):
    from torch.distributed.tensor import Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    ar = a.clone().requires_grad_()
    want = _LOSSES[loss](ar, b, reduction=reduction)
    want.backward()
    mesh = dist.mesh()
    ad = distribute_tensor(a, mesh, [Shard(0)]).requires_grad_()
    got = _LOSSES[loss](ad, distribute_tensor(b, mesh, [Shard(0)]), reduction=reduction)
    got.backward()
    return want.detach(), got.full_tensor(), ar.grad, ad.grad.full_tensor()


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("loss,rows,reduction", [
    ("mse", 4, "mean"), ("smooth_l1", 4, "mean"), ("huber", 4, "mean"), ("bce", 4, "mean"),
    ("mse", 3, "mean"), ("bce_logits", 3, "mean"),
    ("l1", 4, "mean"), ("l1", 3, "mean"), ("mse", 4, "sum"), ("mse", 3, "sum"),
], ids=["mse_even", "smooth_l1_even", "huber_even", "bce_even", "mse_uneven", "bce_logits_uneven",
        "l1_even_control", "l1_uneven_control", "mse_sum_even_control", "mse_sum_uneven_control"])
def test_a_sharded_loss_and_its_gradient_match_the_plain_op(dist, loss: str, rows: int, reduction: str) -> None:
    want, got, want_grad, got_grad = _loss_and_grad(dist, loss, (rows, 8), reduction)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (
        f"{loss}_loss(reduction={reduction}) of a {rows}x8 input sharded on dim 0 over 2 ranks: "
        f"{got.item():.6f}, the plain op {want.item():.6f}")
    ratio = (got_grad.abs().sum() / want_grad.abs().sum()).item()
    assert torch.allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6), (
        f"{loss}_loss(reduction={reduction}) of a {rows}x8 input sharded on dim 0 over 2 ranks: the gradient "
        f"is {ratio:.3f}x the plain op's")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("loss", ["mse", "l1"], ids=["mse_empty", "l1_empty_control"])
def test_an_empty_replicated_loss_backward_gives_nan_like_the_plain_op(dist, loss: str) -> None:
    from torch.distributed.tensor import Replicate, distribute_tensor

    a = torch.zeros(0, 1, 1)
    ar = a.clone().requires_grad_()
    _LOSSES[loss](ar, a).backward()
    ad = distribute_tensor(a, dist.mesh(), [Replicate()]).requires_grad_()
    out = _LOSSES[loss](ad, distribute_tensor(a, dist.mesh(), [Replicate()]))
    try:
        out.backward()
    except RuntimeError as exc:
        pytest.fail(f"{loss}_loss backward of an empty replicated input raised: {exc}")
    assert ad.grad.shape == ar.grad.shape
