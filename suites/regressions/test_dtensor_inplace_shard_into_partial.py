"""DTensor in-place `copy_` / `add_` / `sub_` of a Shard tensor into a Partial one raises
"redistribute from S(0) to P(sum) not supported yet".

Trigger: `dst.copy_(src)` (or `dst.add_(src)`, `dst.sub_(src)`) where `dst` is Partial(sum) or
Partial(avg) (a gradient before its reduction, a row-parallel output) and `src` is Shard(d) (a
sharded parameter or activation): EMA and accumulation updates written between tensors of two
parallelisms. An in-place op keeps `dst`'s placement, so DTensor redistributes `src` to it, and
its redistribution has no Shard -> Partial step (upstream: pytorch/pytorch PR #191828, "support
DTensor S(1) -> Partial('sum')", closed). Measured through the harness, 2 gloo ranks (CPU): torch
2.13.0 raises for copy_ into either kind and add_ into Partial(sum); 2.15.0 is right into
Partial(sum) and still raises for copy_ into Partial(avg). add_ into Partial(avg) and a Replicate
`src` into a Partial(sum) `dst` are right on both (the controls). Found by
the ops generator's in-place entries (reports/fuzz-ops-2026-12-07-inplace.md).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")

CASES = ["copy_shard_into_partial_sum", "add_shard_into_partial_sum", "copy_shard_into_partial_avg",
         "add_shard_into_partial_avg_control", "copy_replicate_into_partial_sum_control"]


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_an_in_place_write_into_a_partial_tensor_takes_any_source_placement(dist, case: str) -> None:
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    mesh = dist.mesh()
    kind = "avg" if "avg" in case else "sum"
    dst_full, src_full = torch.arange(8.0).reshape(4, 2), torch.arange(10.0, 18.0).reshape(4, 2)
    local = dst_full / dist.world_size if kind == "sum" else dst_full.clone()
    dst = DTensor.from_local(local, mesh, [Partial(kind)], run_check=False)
    src = DTensor.from_local(src_full, mesh, [Replicate()], run_check=False)
    if "replicate" not in case:
        src = src.redistribute(mesh, [Shard(0)])
    if case.startswith("copy"):
        dst.copy_(src)
        want = src_full
    else:
        dst.add_(src)
        want = dst_full + src_full
    torch.testing.assert_close(dst.full_tensor(), want, msg=lambda m: f"{case}: the written tensor reads wrong. {m}")
