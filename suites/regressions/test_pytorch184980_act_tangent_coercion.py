"""pytorch#184980: a RowwiseParallel output (AsyncCollectiveTensor) enters a compiled
submodule that returns a view of it alongside compute; its backward breaks.

Trigger (2 ranks): a TP feed-forward (w1 ColwiseParallel, w2 RowwiseParallel,
use_local_output) returns an AsyncCollectiveTensor; a torch.compile'd head returns
`h.view(...)` and compute on `h`. Upstream errors with the fix off:
  2.5.x          AssertionError: We incorrectly attempted to compile the backward with
                 incorrect subclass metadata
  2.6 .. 2.11    RuntimeError: ... we encountered a tensor subclass where we guessed its
                 metadata incorrectly
  2.13, 2.14     AttributeError: 'Tensor' object has no attribute '_local_tensor'
                 (Redistribute.backward), or with a parameter-free head "element 0 of
                 tensors does not require grad": the input's gradient is dropped.
Fix: distci_fixes act_tangent_coercion. Pass means gradients of the input and of every
parameter equal those of the same model run eagerly in one process.

aot_eager on CPU: the bug lives in AOTAutograd, which aot_eager runs in full; on an
accelerator the head is compiled with Inductor, as in training.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("pr")  # cheap, and the proof that the fix package works
FIX_ID = "act_tangent_coercion"
DIM, HIDDEN, BATCH, SEQ = 16, 32, 2, 8


@dataclass(frozen=True)
class Case:
    """`head`: what the compiled submodule returns besides the view of its input."""

    id: str
    head: str


CASES = [
    Case("view_and_linear", "linear"),  # 2.13+: '_local_tensor' in Redistribute.backward
    Case("view_and_tanh", "tanh"),  # 2.13+: the input's gradient is silently lost
]


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.relu(self.w1(x)))


class Head(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.proj = nn.Linear(DIM, DIM) if kind == "linear" else None

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        compute = self.proj(h) if self.proj is not None else torch.tanh(h) * 2
        return h.view(-1, DIM), compute


def _loss(outputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    view, compute = outputs
    return view.square().sum() + compute.sum()


def _full(grad: torch.Tensor | None) -> torch.Tensor | None:
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_act_tangent_coercion(dist, case: Case) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    ffn, head = FeedForward().to(dist.device), Head(case.head).to(dist.device)
    ref_ffn, ref_head = copy.deepcopy(ffn), copy.deepcopy(head)
    x = torch.randn(BATCH, SEQ, DIM, device=dist.device, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_()
    _loss(ref_head(ref_ffn(ref_x))).backward()

    parallelize_module(ffn, dist.mesh(), {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    backend = "aot_eager" if dist.device_type == "cpu" else "inductor"
    compiled_head = torch.compile(head, backend=backend, fullgraph=True)
    _loss(compiled_head(ffn(x))).backward()

    assert x.grad is not None, "the input's gradient was dropped (x.grad is None)"
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-4, atol=1e-5)
    for module, ref_module in ((ffn, ref_ffn), (head, ref_head)):
        for (name, p), (_, ref_p) in zip(module.named_parameters(), ref_module.named_parameters()):
            grad = _full(p.grad)
            assert grad is not None, f"{name}: gradient is None"
            torch.testing.assert_close(grad, ref_p.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
