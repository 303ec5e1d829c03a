"""TP + whole-model inductor compile + a new sequence length: RecursionError (not filed yet).

Trigger (2 ranks): torchtitan's plain TP plan on a cut-down llama (row-parallel
nn.Embedding, a column/row-parallel feed-forward, nn.RMSNorm, column-parallel output
with replicated logits), `torch.compile(model, backend="inductor", fullgraph=True)`,
trained on sequence length 32 and then 24: the second length makes Dynamo recompile with
automatic dynamic shapes, and compiling that graph's backward fails with
    BackendCompilerFailed: ... RecursionError: maximum recursion depth exceeded
(the autograd anomaly note points at the output projection's UnsafeViewBackward0).
torch 2.13.0 and 2.14.1, fixes off and on. The control trains the same model with one
sequence length and passes. Found by the scenario `tp-compile_model-varlen`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
VOCAB, DIM, HIDDEN = 64, 32, 64


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        h = h + self.w2(F.silu(self.w1(h)))
        return self.output(self.norm(h))


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(900)
@pytest.mark.parametrize("lengths", [(32, 24), (32, 32)], ids=["new_length", "same_length_control"])
def test_varlen_compiled_tp(dist, lengths: tuple[int, int]) -> None:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = Tiny().to(dist.device)
    parallelize_module(model, dist.mesh(), {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "w1": ColwiseParallel(), "w2": RowwiseParallel(),
        "output": ColwiseParallel(output_layouts=Replicate()),
    })
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    gen = torch.Generator().manual_seed(1)
    for seq in lengths:
        tokens = torch.randint(0, VOCAB, (2, seq), generator=gen).to(dist.device)
        labels = torch.randint(0, VOCAB, (2, seq), generator=gen).to(dist.device)
        F.cross_entropy(compiled(tokens).flatten(0, 1).float(), labels.flatten()).backward()
    assert model.output.weight.grad is not None
