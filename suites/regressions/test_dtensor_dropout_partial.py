"""DTensor `F.dropout(x, p, training=True)` of a Partial tensor raises DTensor's in-place refusal.

Trigger: dropout in training mode of a Partial(sum) or Partial(avg) DTensor (a row-parallel
projection's output before its reduction, `x @ w` with the contracted dim sharded, fed straight
into nn.Dropout). The plain op masks and scales; DTensor raises "aten.bernoulli_.float: in-place
operations that require placement changes are not supported ... Please use the out-of-place
version" although the caller wrote the out-of-place F.dropout: the op draws its mask with an
in-place bernoulli_ into an empty_like of the input, which keeps the Partial placement, and a
mask cannot be Partial. Measured with torchrun, 2 gloo ranks, torch 2.13.0 and 2.15.0 (CPU):
both placements raise; dropout of a Replicate or Shard(0) tensor, and of the Partial tensor
redistributed to Replicate first, run (the controls). Found by the ops generator's random-op
entries (reports/fuzz-ops-2026-12-07-inplace.md).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")

CASES = ["partial_sum", "partial_avg", "replicate_control", "shard_control", "redistributed_control"]


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_dropout_masks_and_scales_whatever_the_placement(dist, case: str) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    full = torch.arange(1.0, 33.0).reshape(4, 8)
    mesh = dist.mesh()
    if case.startswith("partial") or case == "redistributed_control":
        kind = "avg" if case == "partial_avg" else "sum"
        local = full / dist.world_size if kind == "sum" else full
        x = DTensor.from_local(local, mesh, [Partial(kind)], run_check=False)
        if case == "redistributed_control":
            x = x.redistribute(mesh, [Replicate()])
    else:
        x = DTensor.from_local(full, mesh, [Replicate()], run_check=False)
        if case == "shard_control":
            x = x.redistribute(mesh, [Shard(0)])
    torch.manual_seed(0)
    got = F.dropout(x, p=0.5, training=True).full_tensor()
    kept = got != 0
    torch.testing.assert_close(got[kept], (full * 2)[kept],
                               msg=lambda m: f"{case}: kept elements are not x / (1 - p). {m}")
