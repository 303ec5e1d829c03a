"""DTensor: scaled_dot_product_attention of an empty (zero-element) DTensor raises.

Trigger: `F.scaled_dot_product_attention(q, k, v)` on DTensors with a zero-length dim (an
empty batch, zero queries, zero heads; replicated or sharded) raises "aten.add.Tensor got
mixed torch.Tensor and DTensor". sdpa's early return for empty inputs (pytorch PR #175063,
the fix of pytorch#174939's crash) builds its output with `at::zeros(shape, q.options())`, a
plain tensor, then adds `(q.sum() + k.sum() + v.sum()) * 0` to keep the graph: for a tensor
subclass the sum is a DTensor and the factory's output is not, so the add mixes them
(`q.new_zeros(...)` would dispatch to DTensor). On torch 2.13.0 and 2.15.0 (CPU, gloo,
2026-12-06). The plain-tensor call returns zeros; the control, one query, passes.

Found by the ops generator as `sdpa~2~f32~1x0x1x1,1x0x1x1,1x0x1x1~R,R,R~is_causal=0~0`
(seed 2026-12-06-night, both versions, fixes off; last session's find 7 was the same with a
zero query length). Searched pytorch issues (sdpa + zero-size / empty + DTensor / tensor
subclass): #174939 and PRs #174950, #175000, #175063, #184914 are the empty-input fix and its
follow-up, none names subclasses. Draft: reports/upstream-draft-dtensor-sdpa-empty-input.md.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("queries", [0, 1], ids=["no_query", "one_query_control"])
def test_sdpa_of_replicated_dtensors_matches_the_full_tensor(dist, queries: int) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, queries, 4, generator=gen)
    k, v = torch.randn(1, 2, 3, 4, generator=gen), torch.randn(1, 2, 3, 4, generator=gen)
    mesh = dist.mesh()
    dq, dk, dv = (distribute_tensor(t, mesh, [Replicate()]) for t in (q, k, v))
    try:
        out = F.scaled_dot_product_attention(dq, dk, dv)
    except RuntimeError as exc:
        pytest.fail(f"sdpa of DTensors with query shape {tuple(q.shape)} raised: {exc}")
    torch.testing.assert_close(out.full_tensor(), F.scaled_dot_product_attention(q, k, v))
