"""FSDP2: a module registered under two parents that are sharded as separate units (HF T5 / BART
register the one `shared` embedding in the encoder and in the decoder: `T5Stack(config,
self.shared)`) cannot be sharded: the second parent's fully_shard raises an error that does not
name the shared module (pytorch/torchtitan#2817; pytorch PR #179532 proposes the error
"Parameter ... is already managed by another FSDP group").

Trigger: `fully_shard(model.encoder)`, `fully_shard(model.decoder)`, `fully_shard(model)` where
`model.encoder.embed_tokens is model.decoder.embed_tokens`, as a trainer that shards an
encoder-decoder's halves writes it. The decoder's fully_shard takes the embedding's weight,
already a DTensor of the encoder's unit, for a second time and tries to shard it as a TP
parameter: torch 2.13.0 and 2.15.0 raise "Cannot concatenate overlapping meshes" (a mesh with
dim names, as trainers build) or "Invariant encountered: value was None" (an unnamed mesh).
The models generator draws it as `fsdp-encdec-stack_units` (family=encdec, stacks).
Control: the shared module sharded first, as its own unit (PR #179532's option 2), then the
two halves and the root: the gradients match the single-process model's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


class _Stack(nn.Module):
    def __init__(self, shared: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = shared
        self.proj = nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.embed_tokens(ids))


class _EncoderDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Embedding(16, 8)
        self.encoder = _Stack(self.shared)
        self.decoder = _Stack(self.shared)
        self.head = nn.Linear(8, 16, bias=False)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(src).mean(1, keepdim=True) + self.decoder(tgt))


def _loss(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(src, tgt).flatten(0, 1), labels.flatten())


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("shared_first", [False, True], ids=["halves_share_a_module", "shared_unit_first_control"])
def test_an_encoder_decoders_halves_sharded_as_units_share_the_embedding(dist, shared_first: bool) -> None:
    from ..runner.fsdp import fsdp_api

    fully_shard, _ = fsdp_api()
    mesh = dist.mesh()
    torch.manual_seed(0)
    model, reference = _EncoderDecoder(), _EncoderDecoder()
    reference.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(1)
    src, tgt, labels = (torch.randint(0, 16, (dist.world_size, 4), generator=gen) for _ in range(3))
    try:
        if shared_first:
            fully_shard(model.shared, mesh=mesh)
        fully_shard(model.encoder, mesh=mesh)
        fully_shard(model.decoder, mesh=mesh)
        fully_shard(model, mesh=mesh)
    except (RuntimeError, TypeError) as exc:
        pytest.fail(f"fully_shard(decoder) after fully_shard(encoder), both holding the shared embedding, "
                    f"raised: {type(exc).__name__}: {exc}")
    rank = slice(dist.rank, dist.rank + 1)
    _loss(model, src[rank], tgt[rank], labels[rank]).backward()
    _loss(reference, src, tgt, labels).backward()
    for name, p in reference.named_parameters():
        got = dict(model.named_parameters())[name].grad.full_tensor()
        torch.testing.assert_close(got, p.grad, msg=lambda m, name=name: f"gradient of {name}: {m}")
