"""DTensor `fill_` of a Partial(sum) tensor is silently wrong: each rank fills its addend, so the
pending sum reads the value times the mesh size.

Trigger: `x.fill_(v)` where `x` is Partial(sum) (a row-parallel layer's output before its
all-reduce, a gradient before its reduction). The plain op leaves every element `v`; DTensor keeps
the placement and fills the local tensors, and `full_tensor()` gives `world_size * v`. No error,
no warning. Measured with torchrun, 2 gloo ranks: 2.11.0, 2.13.0 and 2.15.0 read 6.0 for
`fill_(3.0)`; the same fill of a Partial(avg) or a Replicate tensor, `zero_()`, `full_like`,
`ones_like` and `masked_fill` of the Partial(sum) tensor are right (they are the controls here).
Noticed by the ops red-team run of 2026-12-07 (reports/fuzz-ops-2026-12-07-redteam.md), measured
and registered by the lead; the ops generator does not draw `fill_` (no trainer code it reads
calls it on an activation).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")

CASES = {  # name: (placement, what the op does, the value every element must hold)
    "fill_partial_sum": ("sum", lambda x: x.fill_(3.0), 3.0),
    "fill_partial_avg_control": ("avg", lambda x: x.fill_(3.0), 3.0),
    "fill_replicate_control": ("replicate", lambda x: x.fill_(3.0), 3.0),
    "zero_partial_sum_control": ("sum", lambda x: x.zero_(), 0.0),
}


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_fill_gives_the_value_it_was_asked_for(dist, case: str) -> None:
    from torch.distributed.tensor import DTensor, Partial, Replicate

    kind, op, want = CASES[case]
    placement = Replicate() if kind == "replicate" else Partial(kind)
    x = DTensor.from_local(torch.full((2, 3), 1.0 + dist.rank), dist.mesh(), [placement], run_check=False)
    got = op(x).full_tensor()
    torch.testing.assert_close(got, torch.full((2, 3), want),
                               msg=lambda m: f"{case}: the filled DTensor reads back {got[0, 0].item()}, not {want}. {m}")
