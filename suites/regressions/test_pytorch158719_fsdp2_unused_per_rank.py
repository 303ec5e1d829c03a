"""pytorch#158719: under FSDP2, ranks that used different parameters in one backward (an MoE
whose per-expert loop skips the experts no token reached: HF Mixtral / Qwen-MoE, torchtitan's
for-loop path) reduce-scatter different tensors: the collective's sizes disagree and gloo aborts
the process ("Received data size doesn't match expected size"; NCCL hangs instead).

FSDP2's opt-in `set_reduce_scatter_unused_params(True)` makes every rank reduce every
parameter (its other face, a zero gradient for a parameter NO rank used, is
pytorch158719-fsdp2-unused-params-zero-grad). Torch releases without the opt-in (2.11.0 has
none, 2.13.0 has it) give such models no remedy: the models generator's FSDP2 / HSDP MoE
structures opt in where they can and abort where they cannot (found 2026-12-07 on torch 2.11.0,
seed 2026-12-09-t211: hsdp-moe4-shared_expert-reused_block-frozen_lora-attn-mesh_world, shrunk
by hand to fsdp-moe4 and hsdp-moe4).

`per_rank`: rank r's rows go to expert r only, with the opt-in where this torch has it (as the
models generator and a careful trainer do): fails where there is none. `both` (the control):
every rank's rows go through both experts. Each expert's reduced gradient must be the average
of the ranks' gradients, as one process computes it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


class PerRankExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x: torch.Tensor, experts: tuple[int, ...]) -> torch.Tensor:
        return sum(self.experts[e](x) for e in experts)  # an expert not named gets no token: it never runs


@pytest.mark.world_size(2)
@pytest.mark.parametrize("mode", ["per_rank", "both"])
def test_ranks_that_used_different_experts_reduce_their_gradients(dist, mode: str) -> None:
    from ..runner.fsdp import fsdp_api

    torch.manual_seed(0)
    reference = PerRankExperts().to(dist.device)
    model = PerRankExperts().to(dist.device)
    model.load_state_dict(reference.state_dict())
    fully_shard, _ = fsdp_api()
    fully_shard(model, mesh=dist.mesh())
    if hasattr(model, "set_reduce_scatter_unused_params"):
        model.set_reduce_scatter_unused_params(True)
    routed = (lambda r: (r,)) if mode == "per_rank" else (lambda r: (0, 1))
    inputs = [torch.randn(3, 4, generator=torch.Generator().manual_seed(r)).to(dist.device) for r in range(2)]
    model(inputs[dist.rank], routed(dist.rank)).sum().backward()
    # one process: the ranks' mean loss, each rank's rows through its own expert
    (sum(reference(inputs[r], routed(r)).sum() for r in range(2)) / 2).backward()
    for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
        assert got.grad is not None, f"{name}: no gradient after the reduction"
        torch.testing.assert_close(got.grad.full_tensor(), want.grad, msg=lambda m: f"{name}: {m}")
