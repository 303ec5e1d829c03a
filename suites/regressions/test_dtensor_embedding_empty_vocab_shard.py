"""DTensor embedding with the vocabulary row-sharded over more ranks than it has rows to give
each: the rank whose shard is empty raises, the others go on (a hang in a job).

Trigger: `F.embedding(ids, weight)` with weight (V, D) placed Shard(0) on a mesh of 4 where
torch.chunk leaves the last rank no rows (V = 5: 2, 2, 1, 0), any D (0, 1, 3 measured): that
rank alone raises "index_select(): self indexing axis dim should be positive" (the masked
lookup into its empty shard), ranks 0-2 return their _MaskPartial share and wait in the
reduction. V = 8 (2 rows each) is right: the control. Small tables row-sharded on a wide
tp mesh (BERT's two-row token-type table) have empty shards. Standalone (torchrun, 4 gloo
ranks) on torch 2.13.0 and 2.15.0. Found by the ops generator's night runs of 2026-12-07
(`embedding~4~f32~1,5x0~R,S0~-~494`, shrunk from a 13x2 id batch; the width 0 is the draw's,
not the trigger). No upstream issue found (searched 2026-12-07: embedding empty shard,
index_select positive, vocab uneven). Draft: reports/upstream-draft-dtensor-embedding-empty-vocab-shard.md.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("vocab", [5, 8], ids=["vocab5_empty_shard", "vocab8_even_control"])
def test_an_embedding_of_a_row_sharded_table_is_the_plain_lookup(dist, vocab: int) -> None:
    import torch.distributed as tdist
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = dist.mesh((4,), ("tp",))
    weight = torch.randn(vocab, 3, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([0, vocab - 1])
    error = None
    try:  # the local lookup issues no collective: every rank reaches the agreement below
        out = F.embedding(distribute_tensor(ids, mesh, [Replicate()]), distribute_tensor(weight, mesh, [Shard(0)]))
    except RuntimeError as exc:
        error = f"{type(exc).__name__}: {exc}"
    errors: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(errors, error)  # every rank names the ranks that raised and why
    if any(errors):
        raised = [rank for rank, e in enumerate(errors) if e]
        pytest.fail(f"embedding of a ({vocab}, 3) table Shard(0) on 4 ranks: ranks {raised} raised "
                    f"{next(e for e in errors if e)}")
    torch.testing.assert_close(out.full_tensor(), F.embedding(ids, weight))
