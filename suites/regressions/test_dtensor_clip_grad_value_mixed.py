"""clip_grad_value_ over a TP model whose norms and head stay plain tensors (2 ranks).

Trigger: a tensor-parallel plan (w1 column-, w2 row-wise, torchtitan's feed-forward plan)
without sequence parallel leaves the norms and the head plain (replicated) tensors beside
DTensor linears; `torch.nn.utils.clip_grad_value_` over all parameters (Lightning's
`gradient_clip_algorithm="value"`, accelerate's `Accelerator.clip_grad_value_`) groups the
gradients by device and dtype only, so its default foreach path hands one
`_foreach_clamp_min_` both kinds and raises "aten._foreach_clamp_min_.Scalar got mixed
torch.Tensor and DTensor" (torch 2.13.0 and 2.15.0, CPU). The clip_grad_norm_ face of the same
grouping is torchtune#2420 (`test_torchtune2420_clip_mixed_dtensor.py`). `foreach=False` (an
elementwise clamp per gradient) is the control: it equals the single-process clip. Found by the
programs generator's `clip=value` (2026-12-07), shrunk to `tp-ws2-w8-l1-sgd:fwd_bwd,clip=value`.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks
from .conftest import partial_tp_mlp

pytestmark = tier_marks("nightly")
DIM = 8
CLIP = 0.01


@pytest.mark.world_size(2)
@pytest.mark.parametrize("foreach", ["default", "loop"])
def test_clip_grad_value_over_dtensor_and_plain_grads(dist, foreach: str) -> None:
    from torch.distributed.tensor import DTensor

    model, reference = partial_tp_mlp(dist, DIM)
    torch.nn.utils.clip_grad_value_(reference.parameters(), CLIP)
    torch.nn.utils.clip_grad_value_(model.parameters(), CLIP, foreach=None if foreach == "default" else False)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        got = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        # the TP backward sums the norm's gradient in another order: float32 rounding, not more
        assert torch.allclose(got.cpu(), q.grad.cpu(), rtol=1e-5, atol=1e-7), \
            f"{name}: clipped gradient differs from the reference"
