"""SequenceParallel unfreezes the norm weights it parallelizes (silent; not filed yet).

Trigger (2 ranks): an nn.RMSNorm whose weight is frozen (requires_grad=False) is
parallelized with SequenceParallel, as in torchtitan's llama3 plan under LoRA-style
fine-tuning. `SequenceParallel._replicate_module_fn` re-creates the parameter as
`nn.Parameter(DTensor.from_local(...))`, whose default is requires_grad=True: the frozen
weight gets a gradient and an optimizer over trainable parameters updates it.
ColwiseParallel / RowwiseParallel kept the flag since pytorch PR 171709 (issue 171523);
SequenceParallel did not (torch 2.13.0 and 2.14.1 fail with fixes off).
Fix: distci_fixes sequence_parallel_frozen. The second case (ColwiseParallel) is the
control where torch has PR 171709: it passes there, so a failure of the first case is
SequenceParallel's. On torch releases from before that PR (the fix audit found 2.5.1 to
2.8.0) ColwiseParallel loses the flag too (pytorch#171523 itself): the case fails with
fixes off and the fix, which covers Colwise/RowwiseParallel where they lack it, makes it
pass.
Found by suites/test_scenarios.py's `tp_sp-eager-frozen` and `fsdp_tp-eager-frozen-ws4`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("pr")
FIX_ID = "sequence_parallel_frozen"
DIM = 16


def _style(kind: str):
    from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel

    return SequenceParallel() if kind == "sequence_parallel" else ColwiseParallel()


@pytest.mark.world_size(2)
@pytest.mark.parametrize("kind", ["sequence_parallel", "colwise_control"])
def test_frozen_weight_stays_frozen(dist, kind: str) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    module = nn.RMSNorm(DIM) if kind == "sequence_parallel" else nn.Linear(DIM, DIM, bias=False)
    module.to(dist.device).requires_grad_(False)
    parallelize_module(module, dist.mesh(), _style(kind))
    unfrozen = [name for name, p in module.named_parameters() if p.requires_grad]
    assert not unfrozen, f"{kind}: frozen parameters {unfrozen} require grad after parallelize_module"
    x = torch.randn(2, 8, DIM, device=dist.device, requires_grad=True)
    if kind == "sequence_parallel":
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor import DTensor

        x = DTensor.from_local(x, dist.mesh(), [Shard(1)])
    out = module(x)
    (out.to_local() if hasattr(out, "to_local") else out).sum().backward()
    with_grad = [name for name, p in module.named_parameters() if p.grad is not None]
    assert not with_grad, f"{kind}: frozen parameters {with_grad} got a gradient"
