"""An in-place op without a registered DTensor strategy changes its `self`'s placements behind
its back: `out.index_add_(0, index, src)` with `out` replicated and `src` sharded on dim 1
turns `out` into a `Shard(1)` DTensor in place, and the tensor is no longer usable.

Trigger: Mixtral's expert combine as transformers writes it
(`final_hidden_states.index_add_(0, top_x, current_hidden_states)`) where the experts' output is
a DTensor sharded on the hidden dim (a TP expert's output kept as a DTensor) and the buffer is
replicated. `aten.index_add_` has no registered strategy; DTensor derives one from the op's
decomposition (torch/distributed/tensor/_decompositions.py, since torch 2.13), which picks the
sharded layout for the output and runs the op on the local shards, but an in-place op must keep
`self`'s placements (DTensor refuses the registered ones with "in-place operations that require
placement changes are not supported"). The result: every other reference to the buffer (a view,
the caller's name for it) expected a replicated tensor, and the next collective on it fails
("narrow unexpectedly changed concrete size on dim 1: 8 -> 4" in `full_tensor()`). DTensor's contract for in-place ops is to keep `self`'s
placements or refuse ("in-place operations that require placement changes are not supported"):
a refusal passes this test. Controls: the out-of-place `torch.index_add` with the same
placements, and the in-place op on a `self` sharded like `src`. Found by distci's ops generator
(`index_add`, `inplace=1`, 2026-12-06); reproduced standalone on torch 2.13.0 and 2.15.0 CPU
with 2 gloo ranks.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("inplace,self_dim", [(True, None), (False, None), (True, 1)],
                         ids=["inplace_replicated_self", "out_of_place_control", "inplace_sharded_self_control"])
def test_index_add_keeps_what_its_placements_say(dist, inplace: bool, self_dim: int | None) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    base, src, index = torch.randn(5, 4, generator=gen), torch.randn(3, 4, generator=gen), torch.tensor([0, 2, 2])
    want = torch.index_add(base, 0, index, src)
    mesh = dist.mesh()
    out = distribute_tensor(base, mesh, [Replicate() if self_dim is None else Shard(self_dim)])
    dsrc, dindex = distribute_tensor(src, mesh, [Shard(1)]), distribute_tensor(index, mesh, [Replicate()])
    if inplace:
        placements = out.placements
        try:
            out.index_add_(0, dindex, dsrc)
        except RuntimeError as exc:
            if "in-place operations that require placement changes are not supported" in str(exc):
                return  # the registered ops' contract: refused, nothing changed
            raise
        held = tuple(out.to_local().shape)
        assert out.placements == placements, (
            f"index_add_ changed self's placements {placements} -> {out.placements} (the rank holds {held} "
            f"of {tuple(out.shape)})")
    else:
        out = torch.index_add(out, 0, dindex, dsrc)
    says = tuple(out.shape) if all(isinstance(p, Replicate) for p in out.placements) else None
    held = tuple(out.to_local().shape)
    assert says is None or held == says, (
        f"index_add{'_' if inplace else ''} of a replicated self with src Shard(1): the result says "
        f"{out.placements} of {tuple(out.shape)}, the rank holds {held}")
    torch.testing.assert_close(out.full_tensor(), want)
