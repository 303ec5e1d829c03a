"""DTensor rms_norm over a dim the input is sharded on raises (in-place add_ on Partial(avg)).

Trigger: `F.rms_norm` / `nn.RMSNorm` of a DTensor sharded on the normalized (last) dim, as a
QK-norm over the whole output of a column-parallel q/k projection (OLMo-2-style
`q_norm(q_proj(x))` under tensor parallelism) or any norm placed after a colwise linear
without a gather. The decomposition takes the mean of squares over the sharded dim (a
Partial(avg) result) and adds eps in place; DTensor refuses in-place ops that would change a
placement: "aten.add_.Scalar: in-place operations that require placement changes are not
supported. The input has placement (Partial(avg),)". The plain op works; the same norm of a
replicated input is the control. Found by the ops generator as
`rms_norm~2x2~bf16~6x1x16,16~SS2.S2,R.S0~-~738`, shrunk to `rms_norm~2x2~f32~1x4,4~S1.S1,R.R~-~0`
(seed bench, torch 2.13.0 CPU, fixes off, 2026-12-06); standalone the same on 2.15.0. Same
family as dtensor-normalize-partial-backward (an in-place op inside a decomposition on a
Partial value), a forward face.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("sharded", [True, False], ids=["hidden_sharded", "replicated_control"])
def test_rms_norm_matches_the_full_tensor(dist, sharded: bool) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(3, 8, generator=g), torch.randn(8, generator=g)
    mesh = dist.mesh()
    hd = distribute_tensor(h, mesh, [Shard(1) if sharded else Replicate()])
    wd = distribute_tensor(w, mesh, [Shard(0) if sharded else Replicate()])
    try:
        got = F.rms_norm(hd, (8,), wd).full_tensor()
    except RuntimeError as exc:
        pytest.fail(f"rms_norm of a DTensor {'sharded on its normalized dim' if sharded else 'replicated'} raised: {exc}")
    torch.testing.assert_close(got, F.rms_norm(h.to(got.device), (8,), w.to(got.device)))
