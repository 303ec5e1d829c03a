"""DTensor split / chunk / unbind backward raises when the loss never reads one of the outputs.

Trigger: a multi-output view op on a DTensor whose outputs the loss reads only in part
(`q, _ = x.split(n, dim=-1)`, a metric-only output). Autograd hands the op's backward a plain
zeros tensor for each output nobody read; the backward (`cat` for split / chunk, `stack` for
unbind) then meets that plain tensor beside DTensor gradients and raises "aten.cat.default got
mixed torch.Tensor and DTensor". Upstream: pytorch#173123 (open: "Gradient of unused output
becomes plain torch.Tensor in backward", found in torchtitan under torch.compile); this is its
eager face, on every placement, Replicate included. Fails on torch 2.13.0 and 2.15.0 (CPU,
gloo). Found by the ops generator's `use=first` form (reports/fuzz-ops-2026-12-07-redteam.md).
Control: the same op with every output read.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")

CALLS = {
    "split": lambda x: x.split([2, 4], dim=-1),
    "chunk": lambda x: x.chunk(2, dim=-1),
    "unbind": lambda x: x.unbind(0),
}


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("reads", ["first_only", "all_control"])
@pytest.mark.parametrize("op", list(CALLS))
def test_the_gradient_of_a_partly_read_multi_output_op(dist, op: str, reads: str) -> None:
    from torch.distributed.tensor import Replicate, distribute_tensor

    full = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    ref = full.clone().requires_grad_()
    xd = distribute_tensor(full, dist.mesh(), [Replicate()]).requires_grad_()
    outs, ref_outs = CALLS[op](xd), CALLS[op](ref)
    n = 1 if reads == "first_only" else len(ref_outs)
    sum((o * (i + 2)).sum() for i, o in enumerate(ref_outs[:n])).backward()
    try:
        sum((o * (i + 2)).sum() for i, o in enumerate(outs[:n])).backward()
    except RuntimeError as exc:
        pytest.fail(f"{op} backward with {n} of {len(outs)} outputs read raised: {exc}")
    torch.testing.assert_close(xd.grad.full_tensor(), ref.grad)
