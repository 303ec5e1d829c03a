"""clip_grad_norm_ over a TP model whose norms stay plain tensors (2 ranks).

Trigger: torchtitan's llama3 TP plan without sequence parallel leaves the RMSNorm
weights plain (replicated) tensors beside DTensor linears; `torch.nn.utils.clip_grad_norm_`
over all parameters (torchtitan's `training.max_norm`, 1.0 by default) then raises
"aten._foreach_norm.Scalar got mixed torch.Tensor and DTensor" on torch 2.13.0, with
foreach and without (torch.stack of mixed norms). Reported against torchtune
(meta-pytorch/torchtune#2420); torch's own follow-ups: pytorch#121020 (DTensor clipping)
and pytorch#180346 (norms from different meshes). The per-mesh form (a norm per mesh,
combined, as torchtitan does for EP/PP; suites/runner/step.py `clip=mesh`) is the control.
Found by suites/test_scenarios.py's `tp-eager-clip_norm`; norm_type=inf (`tp-eager-clip_inf`,
2026-12-04) raises the same way (foreach norms of the mixed list, on torch 2.13.0).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
DIM = 16


@pytest.mark.world_size(2)
@pytest.mark.parametrize("form", ["norm", "foreach", "mesh", "inf"])
def test_clip_over_dtensor_and_plain_grads(dist, form: str) -> None:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from ..runner.step import clip_grads

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, DIM, bias=False), nn.RMSNorm(DIM)).to(dist.device)
    reference = nn.Sequential(nn.Linear(DIM, DIM, bias=False), nn.RMSNorm(DIM)).to(dist.device)
    reference.load_state_dict(model.state_dict())
    parallelize_module(model, dist.mesh(), {"0": ColwiseParallel(output_layouts=Replicate())})
    x = torch.randn(4, DIM, generator=torch.Generator().manual_seed(1)).to(dist.device)
    for m in (model, reference):
        m(x).pow(2).sum().backward()
    expected = clip_grads(list(reference.parameters()), "inf" if form == "inf" else "norm", max_norm=0.1)
    got = clip_grads(list(model.parameters()), form, max_norm=0.1)
    assert torch.allclose(got.cpu(), expected.cpu(), rtol=1e-5), f"{form}: total norm {float(got)} vs {float(expected)}"
