"""torch.autocast reuses a weight's cast that it cached under no_grad once grad is on again:
the layer's output has no grad_fn and its weight no gradient (pytorch#158232, fixed by
pytorch#165068; present in torch 2.10.0, absent from 2.11 on as measured here).

Trigger: inside one autocast region, a module runs once under torch.no_grad() (a routing
or logging hook, a metric, an eval peek), then again with grad. The first call caches the
low-precision copy of its weight without autograd history; the second reuses it. Found by
the single-device slice's MoE rows under autocast on torch 2.10.0 CPU (2026-12-04): the
routing record (suites/runner/routing.py) runs the router under no_grad in a forward pre-hook, as
routing statistics hooks do, and the router then trained on no gradient at all, while the
loss still matched. Controls: the same layer without the no_grad call.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(1)
@pytest.mark.parametrize("peek", [True, False], ids=["no_grad_first", "control"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_weight_gets_its_gradient_after_a_no_grad_call_under_autocast(dist, dtype: str, peek: bool) -> None:
    device = dist.device
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(8, 4).to(device)
    other = torch.nn.Parameter(torch.ones(4, device=device))  # keeps backward valid when the layer lost its history
    x = torch.randn(3, 8, generator=gen).to(device)
    try:
        with torch.autocast(device.type, dtype=getattr(torch, dtype)):
            if peek:
                with torch.no_grad():
                    layer(x)
            out = layer(x)
    except RuntimeError as exc:  # a device whose autocast takes no such dtype
        pytest.skip(f"autocast on {device.type} takes no {dtype}: {str(exc).splitlines()[0][:120]}")
    (out.float() * other).sum().backward()
    assert layer.weight.grad is not None, "the layer's weight: no gradient (autocast reused its no_grad cast)"
    expected = (x.float().t() @ other.detach().float().expand(3, 4)).t()
    assert torch.allclose(layer.weight.grad.float(), expected, rtol=2e-2, atol=2e-2)
