"""DTensor: the backward of a flatten over a dim sharded by both axes of a 2-D mesh refuses
its own layout (the unflatten is not the inverse of the flatten).

Trigger: a (B, S, D) tensor placed (Shard(1), Shard(1)) on a (dp_shard, tp) mesh (one sequence
dim sharded by two axes, as CP + SP shard it), `flatten(0, 1)` (torchtitan's loss:
`pred.flatten(0, 1)`): the forward gives (_StridedShard(0, sf), _StridedShard(0, sf)) and the
right values; reading the result whole (`full_tensor()`, a Replicate gradient coming back) makes
the backward view it back to (B, S, D), which raises "Cannot unflatten tensor with _StridedShard
placement: split_factor=N does not match any output dimension" for every size, even ones
(4x4x3 too), on every rank; with a 0-long last dim "would remove or reshape sharded dimension 0".
The forward's own inverse, `y.view(B, S, D)`, raises alike. The control shards the dim on one
axis only (Replicate(), Shard(1)): right. Standalone (torchrun, 4 gloo ranks) on torch 2.13.0
and 2.15.0. Upstream: pytorch PR #186282 (open, "Fix DTensor view-unflatten when one output
dim is sharded by 2+ mesh axes"). Found by the ops generator's night runs of 2026-12-07
(`flatten01~2x2~f32~2x2x1~S1.S1~-~0`, `flatten01~2x2~f32~3x2x0~S1.S1~-~0`).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("layout", ["seq_on_both_axes", "seq_on_tp_only_control"])
def test_the_gradient_through_a_flatten_of_a_twice_sharded_dim_is_the_plain_one(dist, layout: str) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = dist.mesh((2, 2), ("dp_shard", "tp"))
    full = torch.randn(4, 4, 3, generator=torch.Generator().manual_seed(0))
    places = [Shard(1), Shard(1)] if layout == "seq_on_both_axes" else [Replicate(), Shard(1)]
    x = distribute_tensor(full, mesh, places).requires_grad_()
    flat = x.flatten(0, 1)
    try:  # every rank raises alike (propagation), so no rank is left in a collective
        flat.full_tensor().pow(2).sum().backward()
    except RuntimeError as exc:
        pytest.fail(f"backward of flatten(0, 1) on {places} (output {flat.placements}) raised: "
                    f"{str(exc).splitlines()[0][:160]}")
    torch.testing.assert_close(x.grad.full_tensor(), 2 * full)
