"""Two vocab-sharded embeddings of different vocabulary sizes in one process: the second
one's backward gets the first one's gradient shape ("Function EmbeddingBackward0 returned
an invalid gradient at index 0 - got [256, 16] but expected shape compatible with [257,
16]"): DTensor's op-strategy cache for aten.embedding_dense_backward left num_weights out
of its key (fixed by pytorch#174727, 2026-02).

Found on torch 2.10.0 CPU (2026-12-04): the table's `tp-eager-uneven` row (vocab 257) failed
after `tp-eager` (vocab 256) in the same rank worker and passed alone. Since then every
test runs in a fresh fork of its rank worker (distci/harness/template.py), with DTensor's
caches as empty as the worker's, so table rows no longer depend on their order, and this
test keeps the bug in view by building both embeddings itself. Users meet it whenever one process
trains or evaluates two models of different vocabularies under TP (a draft and a target
model, an eval harness). The control builds the same vocabulary twice.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("vocabs", [(256, 257), (256, 256)], ids=["other_vocab", "control"])
def test_a_second_sharded_embedding_gets_its_own_gradient_shape(dist, vocabs: tuple[int, int]) -> None:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    for vocab in vocabs:
        emb = torch.nn.Embedding(vocab, 16).to(dist.device)
        parallelize_module(emb, dist.mesh(), RowwiseParallel(input_layouts=Replicate()))
        tokens = torch.arange(32, device=dist.device).remainder(vocab).reshape(2, 16)
        emb(tokens).sum().backward()
        grad = emb.weight.grad.full_tensor()
        assert grad.shape == (vocab, 16), f"vocab {vocab}: gradient of shape {tuple(grad.shape)}"
        counts = torch.bincount(tokens.flatten().cpu(), minlength=vocab).float()
        assert torch.equal(grad.cpu(), counts[:, None].expand(vocab, 16)), f"vocab {vocab}: wrong gradient values"
