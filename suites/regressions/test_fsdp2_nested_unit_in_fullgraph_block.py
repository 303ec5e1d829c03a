"""An FSDP2 unit nested inside a block compiled with fullgraph=True: the forward raises (2 ranks).

Trigger: torchtitan's order (`torch.compile(block, fullgraph=True)` per block, then FSDP2) with a
unit inside the block as well as the block's own: `fully_shard(block.ffn)` then
`fully_shard(block)`, as MoE trainers wrap the experts apart (torchtitan's llama4 / DeepSeek-V3
FSDP(GroupedExperts)). FSDP2's forward hooks are `torch._dynamo.disable`d (its hooks are not
traced: `torch._dynamo.config.skip_fsdp_hooks`), so the inner unit's hook is a graph break, which
fullgraph=True turns into "Unsupported: Attempted to call function marked as skipped" on the first
forward (torch 2.13.0 and 2.15.0, CPU, gloo, 2026-12-08). Upstream knows it as a limitation:
torchtitan compiles such blocks with fullgraph=False (torchtitan PR #1182, #1895, issue #1940) and
pytorch PR #181924 (custom-op FSDP2 hooks for fullgraph, closed unmerged) names the cause. Control:
the same units with fullgraph=False train to the single-process gradient.

Found by the models generator's wrap=nested + compile=blocks (the models night run of 2026-12-08,
pp_fsdp-wrap_nested-compile_blocks; fsdp-wrap_nested-compile_blocks fails alike).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(8, 8)
        self.ffn = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(x)
        return h + self.ffn(h)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "graph_breaks_allowed_control"])
def test_a_compiled_block_with_a_nested_fsdp2_unit_trains(dist, fullgraph: bool) -> None:
    from torch.distributed.fsdp import fully_shard

    torch._dynamo.reset()
    torch.manual_seed(0)
    reference = Block()
    block = copy.deepcopy(reference).to(dist.device)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=fullgraph)
    fully_shard(block.ffn, mesh=dist.mesh())
    fully_shard(block, mesh=dist.mesh())
    x = torch.randn(4, 8)
    try:
        compiled(x.to(dist.device)).sum().backward()
    except Exception as exc:  # noqa: BLE001 - the refusal is the finding; its type is Dynamo's
        pytest.fail(f"fullgraph={fullgraph}: the compiled block's forward raised {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0]}")
    reference(x).sum().backward()
    for (name, got), want in zip(block.named_parameters(), reference.parameters()):
        assert torch.allclose(got.grad.full_tensor(), want.grad, rtol=1e-5, atol=1e-6), (
            f"fullgraph={fullgraph}: {name}'s gradient is not the reference's")
