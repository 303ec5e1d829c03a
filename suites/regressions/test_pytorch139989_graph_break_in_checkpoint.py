"""torch.compile over a checkpointed block with a graph break inside compiles nothing (2 ranks).

Trigger: torchtitan's order (activation checkpointing, then `torch.compile(block)` per block,
then FSDP2) over a block whose forward cannot be one graph: its MoE a per-expert loop, as
production MoE code writes it, whose `torch.where` has a data-dependent size and whose `continue` a
data-dependent branch, compiled with fullgraph=False as a trainer must. Dynamo turns
`checkpoint(f)` into a higher-order op only when `f` traces without a break; with a break inside,
it skips the whole checkpointed frame, so the block, being the checkpoint region, runs wholly
eager: no graph compiled, no error, the numbers right (only the speed is gone). Control: the
same block without checkpointing compiles its graphs around the break. Upstream: pytorch#139989
(open; PR pytorch#193143 falls back to ac(compile(f))); torch 2.13.0 and 2.15.0 compile nothing
(CPU, gloo, 2026-12-08).

Found by the models generator's compile=blocks feature (reports/fuzz-models-2026-12-10-compile.md),
e.g. fsdp-moe2-ac_full-compile_blocks.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ..conftest import tier_marks
from .conftest import counting_aot_eager

pytestmark = tier_marks("nightly")


class LoopedExperts(nn.Module):
    """Top-1 routing over two experts, each run on the tokens routed to it (Mixtral's loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(8, 2, bias=False)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.router(x).argmax(dim=-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            rows = torch.where(choice == i)[0]
            if rows.numel() == 0:
                continue
            out = out.index_add(0, rows, expert(x[rows]))
        return out


class Block(nn.Module):
    """A transformer-like block: its own ops (norm, projection), then the expert loop nested."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)
        self.moe = LoopedExperts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.proj(self.norm(x))
        return h + self.moe(h)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("checkpointed", [True, False], ids=["checkpointed", "control_no_checkpoint"])
def test_a_compiled_checkpointed_block_compiles_a_graph(dist, checkpointed: bool) -> None:
    import torch._dynamo
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    torch._dynamo.reset()
    torch.manual_seed(0)
    graphs: list[int] = []


    block = Block().to(dist.device)
    if checkpointed:
        block = checkpoint_wrapper(block, preserve_rng_state=False)
    block = torch.compile(block, backend=counting_aot_eager(graphs))
    model = nn.Sequential(block)
    fully_shard(model, mesh=dist.mesh())
    x = torch.randn(6, 8, device=dist.device, requires_grad=True)
    model(x).sum().backward()
    assert graphs, ("nothing was compiled: compile=blocks ran eager (a graph break inside the "
                          f"checkpointed block skipped its whole frame; checkpointed={checkpointed})")
