"""DTensor conv2d of a replicated input: the weight's and bias's gradients come back summed over
the ranks (torch 2.11; 2.13.0 right).

Trigger: a patch conv (`nn.Conv2d(kernel_size=2, stride=2)`: ViT / CLIP patch embeddings) whose
input, weight and bias are all `Replicate()` DTensors (a tensor-parallel model's vision tower
before any sharding, or a replicated module under `distribute_module`), then `backward`. Torch
2.11's `convolution_backward_rules` (torch/distributed/tensor/_ops/_conv_ops.py) marks
grad_weight and grad_bias `Partial()` whatever the input's placements: right for a batch-sharded
input (each rank holds its batch's share), but a replicated input gives every rank the whole
gradient, so reading it sums world_size copies: 2x the plain op's on 2 ranks, silently. Torch
2.13.0 replaced the rule by single-dim strategies (grad_weight `Partial` only on the mesh dims
whose input is batch-sharded; pytorch#191926's thread names PR #179185 as where they landed).
Found by the ops generator on torch 2.11.0 (seed 2026-12-09-t211) as
`conv2d_patch~2~bf16~16x6x26x2,13x6x2x2,13~R,R,R~stride=2~228` (gradient of the weight -89 vs
-44.5), shrunk to `conv2d_patch~2~f32~1x2x2,1x1x2x2,1~R,R,R~stride=2~0`. No upstream issue names
this face (searched: conv replicate backward, grad_weight Partial); pytorch#142058 is another
face of replicated conv backward. The control: the batch sharded on the mesh.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("input_dim", [None, 0], ids=["replicated_input", "batch_sharded_control"])
def test_patch_conv_parameter_gradients_match_the_plain_op(dist, input_dim: int | None) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 3, 4, 4, generator=gen), torch.randn(5, 3, 2, 2, generator=gen), torch.randn(5, generator=gen)
    mesh = dist.mesh()
    rep = [Replicate()]
    xd = distribute_tensor(x.to(dist.device), mesh, rep if input_dim is None else [Shard(input_dim)])
    wd = distribute_tensor(w.to(dist.device), mesh, rep).requires_grad_()
    bd = distribute_tensor(b.to(dist.device), mesh, rep).requires_grad_()
    F.conv2d(xd, wd, bd, stride=2).sum().backward()
    wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
    F.conv2d(x, wr, br, stride=2).sum().backward()
    for name, got, want in (("weight", wd.grad, wr.grad), ("bias", bd.grad, br.grad)):
        full = got.full_tensor().cpu()
        ratio = (full.abs().sum() / want.abs().sum()).item()
        assert torch.allclose(full, want, atol=1e-4), (
            f"conv2d's {name} gradient ({got.placements}) of a "
            f"{'replicated' if input_dim is None else 'batch-sharded'} input is {ratio:.3g}x the plain op's")
