"""An EMA of a TP model whose norms and head stay plain tensors, through torch's AveragedModel
with get_ema_multi_avg_fn (2 ranks).

Trigger: a tensor-parallel plan without sequence parallel (w1 column-, w2 row-wise,
torchtitan's feed-forward plan) leaves the norms and the head plain tensors beside DTensor
linears; `AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))` (Lightning's
`EMAWeightAveraging`, torch's documented EMA recipe) deepcopies it, copies the weights at its
first `update_parameters`, and from the second on hands `torch._foreach_lerp_` the parameters
grouped by device and dtype only, both kinds in one list: "aten._foreach_lerp_.Scalar got
mixed torch.Tensor and DTensor" (torch 2.13.0 and 2.15.0, CPU). The same grouping as AdamW's
foreach step (torchtune#2501) and clip_grad_norm_ (torchtune#2420). The per-tensor EMA
(`avg_fn=get_ema_avg_fn(decay)`) is the control: it equals the single-process EMA.
Found by the programs generator's `later_hook` round (`tp_f8-ws4-w16-l2-adam:...,step=ema,...,step=ema`).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks
from .conftest import partial_tp_mlp  # the same TP-without-SP model as its optimizer and clip faces

DIM = 8
DECAY = 0.5

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("update", ["per_tensor", "multi"])
def test_ema_of_dtensor_and_plain_params_together(dist, update: str) -> None:
    from torch.distributed.tensor import DTensor
    from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn, get_ema_multi_avg_fn

    model, reference = partial_tp_mlp(dist, DIM)  # after one backward of the same batch
    fn = {"avg_fn": get_ema_avg_fn(DECAY)} if update == "per_tensor" else {"multi_avg_fn": get_ema_multi_avg_fn(DECAY)}
    averages = [AveragedModel(m, **fn) for m in (model, reference)]
    for step in range(2):  # the first update copies, the second averages
        for m, avg in zip((model, reference), averages):
            torch.optim.SGD(m.parameters(), lr=0.1).step()
            avg.update_parameters(m)
    for (name, p), q in zip(averages[0].module.named_parameters(), averages[1].module.parameters()):
        got = p.full_tensor() if isinstance(p, DTensor) else p
        assert torch.allclose(got.detach().cpu(), q.detach().cpu(), rtol=1e-5, atol=1e-7), \
            f"{name}: the {update} EMA differs from the reference's"
