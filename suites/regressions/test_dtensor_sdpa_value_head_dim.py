"""DTensor scaled_dot_product_attention with V sharded on its head dim raises on CPU.

Trigger: `F.scaled_dot_product_attention(q, k, v)` with q and k replicated and v sharded on
its last (head) dim, as a value projection sharded along its output features without a
head split leaves it. The math is shardable that way (each output column depends on its own
V column only) and DTensor's strategy keeps v sharded, but then runs the flash kernel,
which needs q, k and v to share one head size: "scaled_dot_product_attention_flash_attention:
Q/K/V should have the same head size" on every rank (an error, not a hang). The plain op on
the full tensors works, and so does DTensor with v replicated (the control). Found by the ops
generator as `sdpa~2~bf16~2x13x11x7,2x13x4x7,2x13x4x7~R,R,S3~is_causal=0~735`, shrunk to
`sdpa~2~f32~1x13x11x7,1x13x4x7,1x13x4x7~R,R,S3~is_causal=0~0` (seed bench, torch 2.13.0 CPU,
fixes off, 2026-12-06); the same on 2.15.0. Searched pytorch issues (DTensor sdpa head size,
the message): nothing.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("v_sharded", [True, False], ids=["v_head_dim_sharded", "replicated_control"])
def test_sdpa_matches_the_full_tensors(dist, v_sharded: bool) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    if dist.device.type != "cpu":
        pytest.skip("the flash kernel's head-size check was seen on CPU only")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (5, 4, 4))
    mesh = dist.mesh()
    rep = [Replicate()]
    qd, kd = distribute_tensor(q, mesh, rep), distribute_tensor(k, mesh, rep)
    vd = distribute_tensor(v, mesh, [Shard(3)] if v_sharded else rep)
    try:
        got = F.scaled_dot_product_attention(qd, kd, vd).full_tensor()
    except RuntimeError as exc:
        pytest.fail(f"sdpa with v {'sharded on its head dim' if v_sharded else 'replicated'} raised: {exc}")
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v))
