"""DTensor layer_norm with an affine parameter FSDP2 laid out over TP raises "use_strided_shard_
as_shard_order is True, but placements: (_StridedShard(dim=0, sf=2), Replicate()) is unable to be
interpreted into a corresponding shard_order" (torch 2.11; 2.13.0 right).

Trigger: `F.layer_norm(x, (D,), None, b)` on a ("dp", "tp") mesh with b laid out
(_StridedShard(0, split_factor=2), Shard(0)): FSDP2's layout of a TP-sharded parameter
(fully_shard over a parallelize_module plan: the tp-local shard chunked again on dp, built here as
torch/distributed/fsdp/_fully_shard/_fsdp_param.py builds it) reaching the op unshared, as the
ops generator hands it. Torch 2.11 redistributes the tp axis to Replicate first and the spec
(_StridedShard, Replicate) left on the way cannot be read as a shard order: every rank raises, in
the forward and in the backward. The same message comes from matmul's backward over such an
input (`matmul~2x2~f32~1x1,1x2~SS0.S0,R.R~-~0`). Torch 2.13.0 gives the plain op's values with the
same spec code: its strategies changed (pytorch PR #178785 fixed _StridedShard handling in the
normalization ops; not bisected). Found by the ops generator on torch 2.11.0 (seed 2026-12-09-t211), shrunk to
`layer_norm~2x2~f32~1x1,1,1~R.R,R.R,SS0.S0~-~0`; measured for D = 1, 3, 4 and 8. Control: the
bias replicated.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


def _fsdp_over_tp(full: torch.Tensor, mesh):
    """(_StridedShard(0), Shard(0)) as FSDP2 lays out a TP-sharded parameter on (dp, tp)."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    local = full
    for axis in (1, 0):  # tp's chunk, then dp's chunk of it
        local = torch.chunk(local, mesh.size(axis))[mesh.get_local_rank(axis)]
    return DTensor.from_local(local.contiguous(), mesh, [_StridedShard(0, split_factor=mesh.size(1)), Shard(0)],
                              run_check=False, shape=full.shape, stride=full.stride())


@pytest.mark.world_size(4)
@pytest.mark.parametrize("bias", ["fsdp_over_tp", "replicated_control"])
def test_layer_norm_with_a_strided_shard_bias_matches_the_plain_op(dist, bias: str) -> None:
    from torch.distributed.tensor import Replicate, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    x, b = torch.randn(2, 4, generator=gen), torch.randn(4, generator=gen)
    br = b.clone().requires_grad_()
    want = F.layer_norm(x, (4,), None, br)
    want.square().sum().backward()
    mesh = dist.mesh((2, 2), ("dp", "tp"))
    rep = [Replicate(), Replicate()]
    bd = (_fsdp_over_tp(b.to(dist.device), mesh) if bias == "fsdp_over_tp"
          else distribute_tensor(b.to(dist.device), mesh, rep)).requires_grad_()
    try:
        out = F.layer_norm(distribute_tensor(x.to(dist.device), mesh, rep), (4,), None, bd)
        out.square().sum().backward()
    except ValueError as exc:
        pytest.fail(f"layer_norm with a {bias} bias raised: {exc}")
    torch.testing.assert_close(out.full_tensor().cpu(), want.detach())
    torch.testing.assert_close(bd.grad.full_tensor().cpu(), br.grad)
