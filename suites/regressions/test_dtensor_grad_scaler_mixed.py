"""GradScaler.unscale_ over a TP model whose norms and head stay plain tensors (2 ranks).

Trigger: a tensor-parallel plan (w1 column-, w2 row-wise, torchtitan's feed-forward plan)
without sequence parallel leaves the norms and the head plain tensors beside DTensor linears;
fp16 training through torch.amp.GradScaler (accelerate mixed_precision="fp16", Lightning
"16-mixed") unscales every gradient of the optimizer before a clip or in `step`, and
`_unscale_grads_` groups them by device and dtype only, so one
`_amp_foreach_non_finite_check_and_unscale_` gets both kinds and raises "got mixed
torch.Tensor and DTensor" (torch 2.13.0 and 2.15.0, CPU). The clip_grad_value_ face of the
same grouping is dtensor-clip-grad-value-mixed-dtensor, clip_grad_norm_'s torchtune#2420.
The control unscales the DTensor gradients alone and equals the single-process unscale.
Found by the programs generator's `tp_amp` layout (2026-12-07), e.g.
`tp_amp-ws2-w8-l2-adamw:fwd_bwd=spike,clip,...`.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks
from .conftest import partial_tp_mlp

pytestmark = tier_marks("nightly")
DIM = 8
SCALE = 4.0


@pytest.mark.world_size(2)
@pytest.mark.parametrize("params", ["all", "dtensors"])
def test_grad_scaler_unscales_dtensor_and_plain_grads(dist, params: str) -> None:
    from torch.distributed.tensor import DTensor

    model, reference = partial_tp_mlp(dist, DIM, SCALE)
    chosen = [p for p in model.parameters() if params == "all" or isinstance(p, DTensor)]
    scaler = torch.amp.GradScaler(dist.device_type, init_scale=SCALE)
    scaler.scale(torch.ones((), device=dist.device))
    scaler.unscale_(torch.optim.SGD(chosen, lr=0.1))
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if params == "dtensors" and not isinstance(p, DTensor):
            continue
        got = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        assert torch.allclose(got.cpu(), q.grad.cpu() / SCALE, rtol=1e-5, atol=1e-7), \
            f"{name}: unscaled gradient differs from the reference's"
