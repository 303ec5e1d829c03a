"""torch.compile of a DistributedDataParallel model whose bucket_cap_mb is under 1 MiB (2 ranks).

Trigger: DDP(model, bucket_cap_mb=0.25), compiled (Dynamo's DDPOptimizer, the default
`optimize_ddp`). DDP itself takes the cap (since its first bucket follows a user's
bucket_cap_mb, every bucket is 0.25 MB); DDPOptimizer keeps a 1 MiB first bucket
(`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`) whatever DDP's is, and asserts it is no
larger than the cap: the first compiled forward raises "AssertionError: First bucket
should be smaller/equal to other buckets to get comms warmed up ASAP" (torch 2.13.0 CPU,
gloo, 2026-12-04; measured while choosing suites/scenario/record.py's DDP_BUCKET_MB).
Eager DDP trains with the same cap; bucket_cap_mb=1 is the control. No upstream issue
found (reports/upstream-draft-ddp-optimizer-first-bucket.md).

The failed compiled forward also leaves `DistributedDataParallel._active_ddp_module` set
to this DDP (the exception bypasses the `_inside_ddp_forward` reset): every later
torch.compile in the process then runs DDPOptimizer for a stale module (measured: the
control, run after it in the same rank pool, failed with the same assertion). The test
puts it back whatever happens, and says whether it leaked.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("bucket_cap_mb", [0.25, 1.0], ids=["cap_0.25mb", "cap_1mb"])
def test_compiled_ddp_takes_a_small_bucket_cap(dist, bucket_cap_mb: float) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    width = 512  # 1 MiB of float32 weights per linear: the 0.25 MB cap must split the graph
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(),
                                torch.nn.Linear(width, width)).to(dist.device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(1 + dist.rank)).to(dist.device)
    ddp(x).sum().backward()
    eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    before = DistributedDataParallel._get_active_ddp_module()
    try:
        torch.compile(ddp, backend="aot_eager")(x).sum().backward()
    finally:
        leaked = DistributedDataParallel._get_active_ddp_module() is not before
        DistributedDataParallel._active_ddp_module = before
    assert not leaked, "DistributedDataParallel._active_ddp_module was left set after the compiled forward"
    for p, want in zip(model.parameters(), eager):
        torch.testing.assert_close(p.grad, want)
