"""A parametrization with state (spectral_norm) inside a checkpointed, compiled block (2 ranks).

Trigger: torchtitan's order (activation checkpointing, then `torch.compile(block)`, then FSDP2)
over a block holding `torch.nn.utils.parametrizations.spectral_norm(Linear)` (GAN discriminators,
some vision and audio encoders): its power iteration updates the parametrization's vectors in
the forward, a side effect the checkpoint higher-order op must replay in the backward, which
Dynamo does not support (pytorch#124866, open). With fullgraph=True the first forward raises
"HOP: Unsafe side effect"; with fullgraph=False the block compiles nothing and runs eager
(silent; the numbers stay right). torch 2.13.0 and 2.15.0, CPU, gloo (2026-12-08). Controls: the
same block without checkpointing compiles. Dynamo's own hint,
`torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True`, trades the error for
a backward that does not replay the update.

Found by the models generator (spectral_norm + ac_full under compile=blocks and compile=model;
the models night run of 2026-12-08 on 2.13.0, hsdp-spectral_norm-ac_full-compile_model; fsdp and
ddp alike).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ..conftest import tier_marks
from .conftest import counting_aot_eager

pytestmark = tier_marks("nightly")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.utils.parametrizations.spectral_norm(nn.Linear(8, 8))
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(torch.relu(self.proj(x)))


@pytest.mark.world_size(2)
@pytest.mark.parametrize("checkpointed,fullgraph", [(True, True), (True, False), (False, True)],
                         ids=["checkpointed_fullgraph", "checkpointed", "no_checkpoint_control"])
def test_a_compiled_block_with_spectral_norm_compiles(dist, checkpointed: bool, fullgraph: bool) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    torch._dynamo.reset()
    torch.manual_seed(0)
    graphs: list[int] = []


    block = Block().to(dist.device)
    if checkpointed:
        block = checkpoint_wrapper(block, preserve_rng_state=False)
    model = nn.Sequential(torch.compile(block, backend=counting_aot_eager(graphs), fullgraph=fullgraph))
    fully_shard(model, mesh=dist.mesh())
    try:
        model(torch.randn(4, 8, device=dist.device)).sum().backward()
    except Exception as exc:  # noqa: BLE001 - Dynamo's refusal is the finding
        pytest.fail(f"checkpointed={checkpointed}, fullgraph={fullgraph}: the forward raised "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    assert graphs, ("nothing was compiled: compile=blocks ran eager (the spectral_norm update inside "
                    f"the checkpointed block; checkpointed={checkpointed}, fullgraph={fullgraph})")
