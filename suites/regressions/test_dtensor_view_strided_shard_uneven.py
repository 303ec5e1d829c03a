"""DTensor: a view (flatten) of an FSDP2-over-TP parameter whose dim the 2-D mesh does not divide
raises on every rank.

Trigger: a parameter sharded on dim 0 over tp, then `fully_shard` over dp (torchtitan's order
on a (dp_shard, tp) mesh): FSDP2 labels it (_StridedShard(0, sf=tp), Shard(0)), its local shards
chunked as FSDP2 chunks them (uneven: some dp ranks hold fewer rows or none). DTensor's own
`compute_local_shape_and_global_offset` agrees with FSDP2's shards, yet `flatten(0, 1)` computes
another local shape for the view: "shape '[1, 1]' is invalid for input of size 2" (2 rows over
2x2), "'[3, 1]' ... of size 4" (6 rows). 4 rows (even) are right: the control. Measured with
torchrun, 4 gloo ranks, on torch 2.11.0, 2.13.0 and 2.15.0. Code that reshapes parameters
meets it: optimizers that treat a 3-D weight as a matrix (Muon's `p.view(p.size(0), -1)`), MoE
experts stacked in one tensor. Found by the ops generator's night runs of 2026-12-07
(`flatten01~2x2~f32~2x2x1~SS1.S1~-~0`, `reshape_merge~2x2~f32~1x1x2x2~SS3.S3~-~0`, some ranks
raising; those put the strided shard on another dim, a layout FSDP2 itself refuses to build
unevenly, "FSDP does not support uneven sharding on dim 1"), reduced to FSDP2's own layout here.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(4)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("rows", [2, 6, 4], ids=["rows2_uneven", "rows6_uneven", "rows4_even_control"])
def test_flatten_of_an_fsdp2_over_tp_parameter_is_the_flattened_tensor(dist, rows: int) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    from ..runner.parallelize import fsdp_api

    fully_shard, _ = fsdp_api()
    mesh = dist.mesh((2, 2), ("dp", "tp"))
    full = torch.arange(rows * 2.0).reshape(rows, 2, 1)
    holder = torch.nn.Module()
    holder.w = torch.nn.Parameter(distribute_tensor(full.clone(), mesh["tp"], [Shard(0)]))
    fully_shard(holder, mesh=mesh["dp"])
    try:
        got = holder.w.detach().flatten(0, 1).full_tensor()
    except RuntimeError as exc:
        pytest.fail(f"flatten of the FSDP2-over-TP parameter ({rows} rows, {holder.w.placements}) raised: "
                    f"{str(exc).splitlines()[0][:160]}")
    torch.testing.assert_close(got, full.flatten(0, 1))
