"""DTensor `index_add` with a sharded index or source raises before torch 2.13.

Trigger: `torch.index_add(self, 0, index, source)` (and `self.index_add_`) where `index` or
`source` is sharded on the indexed dim and `self` is replicated: the global op is valid (len(index)
== source.size(0)), but DTensor runs the local op on a shard of one and the whole of the other,
and it raises "index_add_(): Number of indices (4) should be equal to source.size(dim): (2)".
Where trainers meet it: an MoE block that combines its experts' outputs with
`final_hidden_states.index_add_(0, top_x, current_hidden_states)` (transformers' Mixtral) while
the routed tokens are sharded (sequence or expert parallel). Measured with torchrun, 2 and 4 gloo
ranks: torch 2.11.0 raises for index sharded, source sharded and both; 2.13.0 and 2.15.0 give the
plain op's result (their strategy is derived from the decomposition). Found by the one-GPU tier
of 2026-12-07 (torch 2.11.0+cu130): the hash-order repro of index_add raised this instead of
printing placements. Control: every operand replicated.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")

LAYOUTS = {  # (self, index, source): 0 replicated, 1 Shard(0)
    "index_sharded": (0, 1, 0),
    "source_sharded": (0, 0, 1),
    "index_and_source_sharded": (0, 1, 1),
    "replicated_control": (0, 0, 0),
}


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
def test_index_add_matches_the_plain_op(dist, layout: str) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    base, source = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    index = torch.tensor([1, 3, 0, 1])
    placed = [distribute_tensor(t, dist.mesh(), [Shard(0) if sharded else Replicate()])
              for t, sharded in zip((base, index, source), LAYOUTS[layout])]
    try:
        got = torch.index_add(placed[0], 0, placed[1], placed[2]).full_tensor()
    except RuntimeError as exc:
        pytest.fail(f"index_add with {layout} raised: {exc}")
    torch.testing.assert_close(got, torch.index_add(base, 0, index, source))
