"""DTensor embedding with a vocab-sharded weight on one mesh axis and ids sharded on a later axis:
reading the result (`full_tensor()`) raises "The shape of the mask [4, 3] ... does not match
the shape of the indexed tensor [7, 3, 12]".

Trigger: on a 2-D mesh, the weight row-sharded (vocab, Shard(0)) on the first axis and the ids
sharded on the second. The result's placements are (_MaskPartial, Shard(0)): the mask the
_MaskPartial keeps was made from this rank's ids (4 of 7 rows), but redistributing to Replicate
gathers the second axis first, so the mask meets all 7 rows. The mirrored layout, vocab on the
second axis and ids on the first (a TP vocab-parallel embedding under batch-sharded ids, as
torchtitan lays them out), gives (Shard(0), _MaskPartial) and is right: the control. Standalone
(torchrun, 4 gloo ranks) on torch 2.13.0 and 2.15.0: both raise, both controls pass. Found by the
ops generator's red-team run as `embedding~2x2~f32~7x3,11x12~R.S0,S-2.R~-~989`
(reports/fuzz-ops-2026-12-07-redteam.md). No upstream issue found (searched 2026-12-07); draft:
reports/upstream-draft-dtensor-embedding-mask-partial-outer-axis.md.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("layout", ["vocab_outer_ids_inner", "vocab_inner_ids_outer_control"])
def test_a_vocab_sharded_embedding_reads_back_as_the_plain_op(dist, layout: str) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = dist.mesh((2, 2), ("dp_shard", "tp"))
    g = torch.Generator().manual_seed(0)
    ids, weight = torch.randint(0, 11, (7, 3), generator=g), torch.randn(11, 12, generator=g)
    id_places, weight_places = (([Replicate(), Shard(0)], [Shard(0), Replicate()]) if layout.startswith("vocab_outer")
                                else ([Shard(0), Replicate()], [Replicate(), Shard(0)]))
    out = F.embedding(distribute_tensor(ids, mesh, id_places), distribute_tensor(weight, mesh, weight_places))
    try:
        got = out.full_tensor()
    except IndexError as exc:
        pytest.fail(f"full_tensor() of an embedding with placements {out.placements} raised: {exc}")
    torch.testing.assert_close(got, F.embedding(ids, weight))
