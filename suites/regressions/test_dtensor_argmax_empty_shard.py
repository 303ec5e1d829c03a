"""DTensor argmax over a sharded dim whose shard is empty on some ranks raises on those ranks
only, the others wait in the op's collective (a hang in a job): dtensor-max-empty-shard's
mechanism through argmax.

Trigger: `torch.argmax(x, dim=1)` with x a DTensor sharded on dim 1 where the mesh has more ranks
than that dim has chunks (9 rows over 4 ranks: torch.chunk gives 3, 3, 3 and nothing; a vocab or
class dim smaller than the mesh, an accuracy metric over vocab-parallel logits). DTensor runs the
local argmax on every shard; the rank holding no rows raises "max(): Expected reduction dim 1 to
have non-zero size" while its peers go on into the all-gather that combines the shards. Found by
the ops generator on torch 2.11.0 (seed 2026-12-09-t211) as `argmax~4~f32~8x9x0~S-2~dim=1~536`
(and on 2 ranks as `argmax~2~f32~13x1~S-1~dim=-1~357`, a dim of 1 over 2 ranks). The mesh's
group here has a 20 s timeout, so the waiting ranks leave with their own error instead of
hanging; every rank then says what it met. Control: 12 rows, no empty shard.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("rows", [9, 12], ids=["empty_shard", "no_empty_shard_control"])
def test_argmax_over_a_sharded_dim_with_an_empty_shard(dist, rows: int) -> None:
    import torch.distributed as tdist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    x = torch.randn(2, rows, 3, generator=torch.Generator().manual_seed(0))
    group = tdist.new_group(list(range(dist.world_size)), timeout=timedelta(seconds=20))
    mesh = DeviceMesh.from_group(group, dist.device.type)
    try:
        got = torch.argmax(distribute_tensor(x.to(dist.device), mesh, [Shard(1)]), dim=1).full_tensor().cpu()
        met = None if torch.equal(got, torch.argmax(x, dim=1)) else f"a wrong answer {got.tolist()}"
    except Exception as exc:  # noqa: BLE001 - the raising ranks' error and the waiting ranks' timeout both count
        met = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    everyone: list = [None] * dist.world_size
    tdist.all_gather_object(everyone, met)
    failed = [(rank, m) for rank, m in enumerate(everyone) if m]
    raised = [rank for rank, m in failed if "non-zero size" in m]
    first = next((m for _, m in failed if "non-zero size" in m), failed[0][1] if failed else "")
    assert not failed, (f"argmax over dim 1 ({rows} rows sharded on {dist.world_size} ranks) with empty shards raised on "
                        f"ranks {raised} only, ranks {[r for r, _ in failed if r not in raised]} waited: {first}")
