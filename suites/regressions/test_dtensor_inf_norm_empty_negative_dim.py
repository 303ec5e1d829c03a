"""DTensor vector_norm(ord=inf) of an empty tensor over a NEGATIVE dim raises; the plain op does not.

Trigger: `torch.linalg.vector_norm(x, ord=inf, dim=-2)` of a replicated DTensor of shape (1, 0):
the reduced dim has one element, another dim is empty. The plain op returns an empty result;
DTensor raises "linalg.vector_norm cannot compute the inf norm on the dimension -2 because this
dimension is empty" on every rank, as if the negative dim were read against another shape.
The same reduction written `dim=0` works: the control. Where trainers meet it: an inf-norm (gradient
clipping with `norm_type=inf`, a max-abs metric) over a parameter or gradient with an empty
dim (an empty expert, a zero-size LoRA rank). Found by the ops generator as
`vector_norm~2x2~bf16~6x1x0~S0.S0~ord=inf,dim=-3,keepdim=0~51`, shrunk to
`vector_norm~2~f32~1x1x0~R~ord=inf,dim=-3,keepdim=0~0` (seed bench, torch 2.13.0 CPU, fixes off,
2026-12-06); standalone the same on 2.15.0.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("dim", [-2, 0], ids=["negative_dim", "same_dim_positive_control"])
def test_inf_norm_of_an_empty_tensor_matches_the_plain_op(dist, dim: int) -> None:
    from torch.distributed.tensor import Replicate, distribute_tensor

    x = torch.randn(1, 0)
    try:
        got = torch.linalg.vector_norm(distribute_tensor(x, dist.mesh(), [Replicate()]), ord=float("inf"), dim=dim)
        got = got.full_tensor()
    except RuntimeError as exc:
        pytest.fail(f"inf-norm over dim {dim} of a replicated (1, 0) DTensor raised: {exc}")
    assert tuple(got.shape) == tuple(torch.linalg.vector_norm(x, ord=float("inf"), dim=dim).shape)
