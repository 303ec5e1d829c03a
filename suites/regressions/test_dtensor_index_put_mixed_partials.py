"""DTensor index_put writing Partial(avg) rows into a Partial(sum) tensor raises on torch 2.15:
"Redistribution from one partial type (P(avg)) to another (P(sum)) is unsupported" (2.13 is
right).

Trigger: `out = base.clone(); out[rows, :] = values` (a mask-token write, torchtitan's MoE
unpermute) with base Partial(sum) (a row-parallel matmul's output before its all-reduce) and
values Partial(avg) (a mean over a sharded dim), on a 1-D mesh of 2 ranks. Control: values
Partial(sum) too. Found by the ops night run on 2.15.0 (seed 2026-12-07-night) as
`index_put~2~f32~1x1,1,1x1~Psum,R,Pavg~base=clone~0`. Standalone (torchrun, 2 gloo ranks,
2026-12-07): 2.15.0 raises, 2.13.0 returns the plain op's value. The same Partial-to-Partial
redistribution that dtensor-cat-mixed-partial-types (cat, before 2.14) and
dtensor-add-mixed-partial-types (`+`, before 2.13) chose; upstream made it an error in
pytorch#172041 / #172042, and index_put's strategy on 2.15 still picks it.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("values", ["values_partial_avg", "values_partial_sum_control"])
def test_index_put_of_partial_rows_matches_the_plain_op(dist, values: str) -> None:
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

    mesh = dist.mesh()
    g = torch.Generator().manual_seed(0)
    base, rows = torch.randn(3, 2, generator=g), torch.randn(1, 2, generator=g)
    kind = "avg" if "avg" in values else "sum"
    d_base = DTensor.from_local(base / dist.world_size, mesh, [Partial("sum")], run_check=False)
    share = rows if kind == "avg" else rows / dist.world_size
    d_rows = DTensor.from_local(share.clone(), mesh, [Partial(kind)], run_check=False)
    index = distribute_tensor(torch.tensor([1]), mesh, [Replicate()])
    out = d_base.clone()
    try:
        out[index, :] = d_rows
    except AssertionError as exc:
        pytest.fail(f"index_put of Partial({kind}) rows into a Partial(sum) tensor raised: {exc}")
    want = base.clone()
    want[torch.tensor([1]), :] = rows
    torch.testing.assert_close(out.full_tensor(), want)
