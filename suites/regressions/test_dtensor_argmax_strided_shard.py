"""argmax of a DTensor laid out with _StridedShard raises NotImplementedError (2 ranks).

Trigger: logits sharded on the sequence dim (sequence parallel, loss parallel) flattened to
(batch * seq, vocab) as loss and metric code writes it (`logits.view(-1, vocab)`), then
`argmax(-1)` for the predicted tokens (token accuracy, greedy decoding). The flatten gives
`_StridedShard(0)` and DTensor's argmax/argmin handler
(torch/distributed/tensor/_nonlinear_redux.py, `_collect_shard_mesh_dims`) raises
"aten.argmax.default does not support _StridedShard!" for any _StridedShard, here on a dim
the argmax does not reduce; amax and sum of the same DTensor work, and so does argmax of the
unflattened (batch, seq, vocab) tensor (the control). The FSDP2-over-TP layout
(_StridedShard on dp over Shard on tp) raises the same. torch 2.13.0 and 2.15.0 (CPU, gloo,
2026-12-06).
Found by the ops generator (distci fuzz --generator ops, seed bench) as
`argmax~2x2~f32~5x2~SS1.S1~dim=-2~987`, shrunk to `argmax~2x2~f32~1x1~SS1.S1~dim=-2~0`.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("flatten", [True, False], ids=["flattened_seq_sharded", "unflattened"])
def test_argmax_of_sequence_sharded_logits(dist, flatten: bool) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(0))
    logits = distribute_tensor(full.to(dist.device), dist.mesh(), [Shard(1)])
    if flatten:
        logits, full = logits.view(-1, 6), full.view(-1, 6)
    got = logits.argmax(-1).full_tensor().cpu()
    assert torch.equal(got, full.argmax(-1)), f"argmax of {tuple(logits.placements)}: {got.tolist()}"
