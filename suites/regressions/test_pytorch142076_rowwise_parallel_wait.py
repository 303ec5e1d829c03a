"""pytorch#142076: under torch.compile, `if isinstance(out, AsyncCollectiveTensor):
out = out.wait()` after a RowwiseParallel layer burns `.wait()` into the graph.

Upstream error with the fix off (torch <= 2.5.1; fixed by pytorch PR 142075 in 2.6.0):
  AttributeError: 'FunctionalTensor' object has no attribute 'wait'
Fix: distci_fixes rowwise_parallel_wait.

The model is what eager-TP code (sglang's RowwiseParallel wrapper) wrote: a TP
feed-forward whose output is waited on when it is an AsyncCollectiveTensor, compiled
whole. Pass means its output and every gradient equal the single-process model's.
(Run eagerly, the same code loses the gradients before the wait, since ACT.wait()
returns a tensor detached from autograd; under compile the branch must not be taken.)
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("pr")  # cheap, and the proof that the fix package works
FIX_ID = "rowwise_parallel_wait"
DIM, HIDDEN, BATCH, SEQ = 16, 32, 2, 8


class WaitingFeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor

        out = self.w2(torch.relu(self.w1(x)))
        if isinstance(out, AsyncCollectiveTensor):
            out = out.wait()
        return torch.tanh(out)


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
def test_rowwise_parallel_wait(dist) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = WaitingFeedForward().to(dist.device)
    ref = copy.deepcopy(model)
    x = torch.randn(BATCH, SEQ, DIM, device=dist.device)
    ref_out = ref(x)
    ref_out.square().sum().backward()

    parallelize_module(model, dist.mesh(), {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    backend = "aot_eager" if dist.device_type == "cpu" else "inductor"
    out = torch.compile(model, backend=backend, fullgraph=True)(x)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
    out.square().sum().backward()
    for (name, p), (_, ref_p) in zip(model.named_parameters(), ref.named_parameters()):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        assert grad is not None, f"{name}: gradient is None"
        torch.testing.assert_close(grad, ref_p.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
