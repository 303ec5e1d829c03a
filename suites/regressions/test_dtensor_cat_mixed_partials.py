"""DTensor `cat` of a Partial(sum) and a Partial(avg) tensor raises before torch 2.14 (and `+` of
them before 2.13): "Redistribution from one partial type (P(avg)) to another (P(sum)) is unsupported".

Upstream made a Partial-to-Partial redistribution of another reduce op an error instead of a
silent no-op (pytorch#172041) and its cost infinite so no strategy picks it (pytorch#172042).
Until the strategies of these ops stopped choosing it, they raised on inputs that are valid:
both operands hold a pending reduction, of different kinds (a row-parallel output before its
all-reduce is Partial(sum); a mean over a sharded dim is Partial(avg)). Measured with torchrun, 2
gloo ranks: `torch.cat([p_sum, p_avg])` raises on 2.11.0 and 2.13.0 and is right on 2.14.1 and
2.15.0; `p_sum + p_avg` raises on 2.11.0 and is right from 2.13.0; `torch.stack` is right on every
one. Found by the ops generator's idle bench (seed bench, torch 2.13.0 CPU, fixes off,
2026-12-07) as `cat~2x2~f32~5x6,5x6~S0.Psum,R.Pavg~dim=0~845`, shrunk to
`cat~2~f32~1x1,1x1~Psum,Pavg~dim=0~0`. Controls: stack of the same pair, cat of two Partial(sum).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")

OPS = {
    "cat": lambda a, b: torch.cat([a, b]),
    "add": lambda a, b: a + b,
    "stack_control": lambda a, b: torch.stack([a, b]),
    "cat_same_partial_control": lambda a, b: torch.cat([a, a]),
}


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("op", list(OPS), ids=list(OPS))
def test_an_op_of_two_partial_kinds_matches_the_plain_op(dist, op: str) -> None:
    from torch.distributed.tensor import DTensor, Partial

    rank = dist.rank
    a_local, b_local = torch.tensor([[1.0 + rank]]), torch.tensor([[10.0 * (rank + 1)]])
    a = DTensor.from_local(a_local, dist.mesh(), [Partial("sum")], run_check=False)
    b = DTensor.from_local(b_local, dist.mesh(), [Partial("avg")], run_check=False)
    want_a = sum(torch.tensor([[1.0 + r]]) for r in range(dist.world_size))
    want_b = sum(torch.tensor([[10.0 * (r + 1)]]) for r in range(dist.world_size)) / dist.world_size
    try:
        got = OPS[op](a, b).full_tensor()
    except (AssertionError, RuntimeError) as exc:
        pytest.fail(f"{op} of a Partial(sum) and a Partial(avg) DTensor raised: {exc}")
    torch.testing.assert_close(got, OPS[op](want_a, want_b))
