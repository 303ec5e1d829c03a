"""DTensor in-place `copy_` / `add_` / `sub_` between a Partial(sum) and a Partial(avg) tensor
raises an AssertionError ("Redistribution from one partial type (P(avg)) to another (P(sum)) is
unsupported") instead of writing the value or refusing by name.

Trigger: `dst.copy_(src)` with `dst` Partial(sum) and `src` Partial(avg) (also `add_` / `sub_`;
and `copy_` with the kinds swapped): an in-place op keeps `dst`'s placement, so DTensor plans
`src` -> `dst`'s Partial, the Partial-to-Partial step upstream made an error (pytorch/pytorch PR
#172041; its review notes P(sum) -> Replicate -> P(avg) would do). Unlike the out-of-place pair
(dtensor-cat-mixed-partial-types, dtensor-add-mixed-partial-types: right since 2.14.1 / 2.13.0),
the in-place one still raises on torch 2.13.0 and 2.15.0 (torchrun, 2 gloo ranks, CPU);
`add_` of a Partial(sum) into a Partial(avg) is right (the control). Found by the ops generator's
in-place entries (reports/fuzz-ops-2026-12-07-inplace.md).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")

CASES = {  # name: (dst kind, src kind, op)
    "copy_avg_into_sum": ("sum", "avg", "copy_"),
    "add_avg_into_sum": ("sum", "avg", "add_"),
    "copy_sum_into_avg": ("avg", "sum", "copy_"),
    "add_sum_into_avg_control": ("avg", "sum", "add_"),
}


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_an_in_place_write_between_partial_kinds_gives_the_value(dist, case: str) -> None:
    from torch.distributed.tensor import DTensor, Partial

    dst_kind, src_kind, op = CASES[case]
    mesh = dist.mesh()
    n = dist.world_size

    def partial(full, kind):
        return DTensor.from_local(full / n if kind == "sum" else full.clone(), mesh, [Partial(kind)], run_check=False)

    dst_full, src_full = torch.full((2, 2), 1.0), torch.full((2, 2), 5.0)
    dst = partial(dst_full, dst_kind)
    getattr(dst, op)(partial(src_full, src_kind))
    want = src_full if op == "copy_" else dst_full + src_full
    torch.testing.assert_close(dst.full_tensor(), want, msg=lambda m: f"{case}: the written tensor reads wrong. {m}")
