"""In-place division of a Partial(sum) DTensor, as pipelining scales a TP stage's gradients (2 ranks).

Trigger: `torch.distributed.pipelining`'s `scale_grads` divides every gradient in place by
the number of microbatches (`p.grad.div_(n)`). Under TP with SequenceParallel norms, a
norm weight's gradient is a DTensor with a Partial(sum) placement until it is reduced.
Dividing a Partial(sum) by a scalar is linear and keeps it Partial; torch 2.10.0 instead
asks to redistribute it to Replicate and, in place, refuses: "aten.div_.Tensor: in-place
operations that require placement changes are not supported" (CPU, 2026-12-02). 2.11.0
and later keep the placement and pass (the same pp_tp rows pass there).
Found by suites/test_scenarios.py's `pp_tp-*-eager-ga2-ws4` rows outside the matrix on
torch 2.10.0. Out-of-place `grad / n` is the control.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
MICROBATCHES = 2


@pytest.mark.world_size(2)
@pytest.mark.parametrize("how", ["in_place", "out_of_place"])
def test_partial_gradient_divides_by_the_microbatches(dist, how: str) -> None:
    from torch.distributed.tensor import DTensor, Partial

    mesh = dist.mesh()
    local = torch.full((4,), float(dist.rank + 1), device=dist.device)
    grad = DTensor.from_local(local, mesh, [Partial()], run_check=False)
    if how == "in_place":
        grad.div_(MICROBATCHES)  # what pipelining's stage.scale_grads does
    else:
        grad = grad / MICROBATCHES
    total = sum(range(1, dist.world_size + 1))
    assert torch.allclose(grad.full_tensor(), torch.full((4,), total / MICROBATCHES, device=dist.device))
