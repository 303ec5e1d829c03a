"""DTensor: torch.bincount of a DTensor raises an unnamed error instead of a missing-strategy one (2 ranks).

Trigger: tokens per expert counted with `torch.bincount(indices, minlength=num_experts)` (Megatron-LM's
MoE utilities; torchtitan counts with torch.histc instead) on routing indices that are a DTensor
(a batch-sharded router output). bincount has no sharding strategy; DTensor then propagates through
FakeTensor, whose bincount raises DynamicOutputShapeException (the output's length is
data-dependent), and the user sees "RuntimeError: aten.bincount.default / Sharding propagation failed
for aten.bincount.default(...)": not the "does not have a sharding strategy registered" every other
op without one says, and no hint that `minlength` does not make the shape static. torch.histc with
the same bins runs: the control. Torch 2.13.0 (CPU, gloo, 2026-12-07). No upstream issue found
(searched: DTensor bincount, DynamicOutputShapeException sharding propagation); draft:
reports/upstream-draft-dtensor-bincount-data-dependent.md.

Found by the ops generator's second inventory round (reports/fuzz-ops-2026-12-10-inventory2.md),
`count_tokens~2~f32~4~R~how=bincount,bins=3~912`: Replicate raises too.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("how", ["bincount", "histc_control"])
def test_tokens_per_expert_of_dtensor_indices(dist, how: str) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    indices = torch.tensor([0, 2, 2, 1, 0, 2])
    ref = torch.bincount(indices, minlength=4)
    d = distribute_tensor(indices.to(dist.device), dist.mesh(), [Shard(0)])
    try:
        got = torch.bincount(d, minlength=4) if how == "bincount" else \
            torch.histc(d.float(), bins=4, min=0, max=4).long()
    except RuntimeError as exc:
        pytest.fail(f"{how} of {d.placements} indices raised: {str(exc).splitlines()[0]}")
    assert torch.equal(got.full_tensor().cpu(), ref), f"{how}: {got.full_tensor().tolist()} vs {ref.tolist()}"
