"""AdamW's foreach and fused steps over a TP model whose norms and head stay plain tensors
(2 ranks).

Trigger: a tensor-parallel plan without sequence parallel (w1 column-, w2 row-wise,
torchtitan's feed-forward plan) leaves the norms and the head plain tensors beside DTensor
linears; `torch.optim.AdamW(..., foreach=True)` or `(fused=True)` (torchtitan's
`implementation: foreach | fused`, its default fused; Hugging Face `adamw_torch_fused`) groups
the parameters by device and dtype only, so one `_foreach_mul_` / `_fused_adamw_` gets both kinds
and raises "got mixed torch.Tensor and DTensor" (torch 2.13.0 and 2.15.0, CPU). torchtune
refuses the combination in its TP recipe for this reason (meta-pytorch/torchtune#2501: "our
tensor parallel implementation is incompatible with fused Adam ... we are not applying sequence
parallel to our norm layers"); clip_grad_norm_'s face of the same grouping is torchtune#2420.
The for-loop step (torch's CPU default) is the control: it equals the single-process step.
Found by the programs generator's `later_optim` round (`tp-ws2-w8-l1-adamw_fused:fwd_bwd,step`).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks
from ..probes import capabilities
from .conftest import partial_tp_mlp  # the same TP-without-SP model as its clip and GradScaler faces

DIM = 8

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("impl", ["for_loop", "foreach", "fused"])
def test_adamw_steps_dtensor_and_plain_params_together(dist, impl: str) -> None:
    from torch.distributed.tensor import DTensor

    if capabilities.optimizer_impl(dist.device_type, "adamw", impl):
        pytest.skip(capabilities.optimizer_impl(dist.device_type, "adamw", impl))
    model, reference = partial_tp_mlp(dist, DIM)  # after one backward of the same batch
    torch.optim.AdamW(reference.parameters(), lr=1e-2).step()
    flags = {} if impl == "for_loop" else {impl: True}
    torch.optim.AdamW(model.parameters(), lr=1e-2, **flags).step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        got = p.full_tensor() if isinstance(p, DTensor) else p
        assert torch.allclose(got.detach().cpu(), q.detach().cpu(), rtol=1e-5, atol=1e-7), \
            f"{name}: the {impl} step differs from the reference's"
