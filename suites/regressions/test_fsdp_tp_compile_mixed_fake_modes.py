"""FSDP2 over TP, whole model torch.compile'd: "Mixing fake modes NYI" (not filed yet).

Trigger (4 ranks, a 2 x 2 mesh dp_shard x tp): an nn.Embedding row-parallel over `tp`
with sequence-sharded output and a column-parallel head (torchtitan's llama3 plan, cut
down), FSDP2 `fully_shard` on `dp_shard` per submodule and at the root, then the whole
model compiled (not fullgraph: Dynamo breaks the graph at FSDP2's disabled hooks).
AOTAutograd then fails on the embedding with
    AssertionError: Mixing fake modes NYI x.fake_mode=... vs self=...
on torch 2.13.0 and 2.14.1, with fixes off and on. The controls pass: the same model
with FSDP2 alone (1-D) or TP alone, compiled the same way. Found by the scenario
`fsdp_tp-compile_model_aot_eager-ws4`. No fix in distci-fixes.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
VOCAB, DIM, SEQ = 64, 32, 8


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.output(self.tok_embeddings(tokens))


def _build(dist, layout: str) -> nn.Module:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = Tiny().to(dist.device)
    if layout == "fsdp_tp":
        mesh = dist.mesh((2, 2), ("dp_shard", "tp"))
        tp, dp = mesh["tp"], mesh["dp_shard"]
    else:
        mesh = dist.mesh((4,), ("tp",) if layout == "tp" else ("dp_shard",))
        tp, dp = (mesh, None) if layout == "tp" else (None, mesh)
    if tp is not None:
        parallelize_module(model, tp, {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        })
    if dp is not None:
        fully_shard, _ = fsdp_api()
        fully_shard(model.tok_embeddings, mesh=dp)
        fully_shard(model, mesh=dp, reshard_after_forward=False)
    return model


@pytest.mark.world_size(4)
@pytest.mark.dist_timeout(600)
@pytest.mark.parametrize("layout", ["fsdp_tp", "fsdp_control", "tp_control"])
def test_whole_model_compile(dist, layout: str) -> None:
    model = _build(dist, "fsdp" if layout == "fsdp_control" else "tp" if layout == "tp_control" else layout)
    compiled = torch.compile(model, backend="aot_eager")
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1)).to(dist.device)
    compiled(tokens).float().square().mean().backward()
    assert model.output.weight.grad is not None
