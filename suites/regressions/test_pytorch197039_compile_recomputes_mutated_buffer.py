"""torch.compile: the backward recomputes a read of a buffer the forward mutated in place,
after the mutation, and the gradients come out wrong (pytorch PR #197039, open).

Trigger: a module that increments a persistent buffer under no_grad in its training forward
and then uses it (a step counter, as the programs generator's model and BatchNorm's
num_batches_tracked do), compiled (aot_eager: AOTAutograd's min-cut partitioner, no
inductor needed). The partitioner recomputes `1 + seen` in the backward instead of saving
it; the recompute reads the buffer after the forward's epilogue wrote the increment back,
so the backward sees one increment more than the forward: the gradient is (1 + 2) / (1 + 1)
= 1.5x eager's here. Silent. Found by the programs generator as
`fsdp-ws4-w32-l1-adamw:compile,step,zero_grad,fwd_bwd,...` ("at action fwd_bwd: gradient
SQNR 33.7 dB" on every parameter, the single-process twin compiled too), torch 2.13.0 CPU,
fixes off, 2026-12-06; FSDP2-wrapped, the compiled model matches eager (its hooks split the
graph), DDP and plain compile do not. One process. The eager run is the control.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


class Counting(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.seen.add_(1)
        return self.lin(x) * (1 + self.seen)


def _twins(backend: str, rows: int):
    """A batch, an eager model, its copy, and what runs the copy (compiled unless the control)."""
    torch.manual_seed(0)
    x = torch.randn(rows, 4, generator=torch.Generator().manual_seed(1))
    eager = Counting()
    compiled = Counting()
    compiled.load_state_dict(eager.state_dict())
    return x, eager, compiled, compiled if backend == "eager_control" else torch.compile(compiled, backend=backend)


@pytest.mark.parametrize("backend", ["eager_control", "aot_eager"])
def test_a_compiled_forward_that_bumps_a_buffer_has_eagers_gradient(backend: str) -> None:
    x, eager, compiled, runnable = _twins(backend, rows=2)
    eager(x).sum().backward()
    runnable(x).sum().backward()
    assert float(compiled.seen) == float(eager.seen) == 1.0
    ratio = float(compiled.lin.weight.grad.norm() / eager.lin.weight.grad.norm())
    assert torch.allclose(compiled.lin.weight.grad, eager.lin.weight.grad, rtol=1e-5, atol=1e-6), (
        f"compiled ({backend}) gradient is {ratio:.3f}x eager's: the backward read the buffer after the "
        "forward's in-place update")


@pytest.mark.parametrize("backend", ["eager_control", "aot_eager"])
def test_two_compiled_forwards_before_one_backward_keep_the_buffer_the_first_one_read(backend: str) -> None:
    """The same bug's other face (PR #197039 names it: "a version-counter error when the input
    reaches the backward through SavedVariable"): two forwards before one backward (GAN
    discriminators, two-view contrastive losses, DPO's chosen/rejected forwards). The first
    forward's backward holds the buffer itself; the second forward bumps it, and the backward
    raises "one of the variables needed for gradient computation has been modified by an
    inplace operation: [torch.FloatTensor []]". Found by the programs generator's night runs
    (2026-12-07, torch 2.13.0 and 2.15.0, fixes off) as `tp-ws2-w8-l1-sgd:compile,fwd_bwd=twice`;
    one process, aot_eager and inductor alike (measured standalone). Eager is the control."""
    x, eager, compiled, runnable = _twins(backend, rows=4)
    (eager(x[:2]).sum() + eager(x[2:]).sum()).backward()
    try:
        (runnable(x[:2]).sum() + runnable(x[2:]).sum()).backward()
    except RuntimeError as exc:
        pytest.fail(f"compiled ({backend}): two forwards, one backward: {str(exc).splitlines()[0][:200]}")
    assert float(compiled.seen) == float(eager.seen) == 2.0
    assert torch.allclose(compiled.lin.weight.grad, eager.lin.weight.grad, rtol=1e-5, atol=1e-6), (
        f"compiled ({backend}): two forwards, one backward: the backward read the buffer after the "
        "forward's in-place update")
