"""DTensor gather over a sharded dim, then a view of the result (`.squeeze(-1)`, `.reshape`):
reading it raises, because the _MaskPartial it carries keeps a mask of the gather's own shape.

Trigger: logits (B, S, V) sharded on the vocab dim (Shard(-1): a TP run's colwise output, or
log_softmax under loss_parallel(), which keeps that placement), `torch.gather(x, 2,
labels.unsqueeze(-1)).squeeze(-1)`: the per-token log-probabilities DPO / TRL
(`selective_log_softmax`) / torchtune's `logits_to_logprobs` gather. The result is
_MaskPartial; its reduction applies the (B, S, 1) mask to the (B, S) tensor: "IndexError: too
many indices for tensor of dimension 2" on every rank (a flattened (B*S, V) gather reshaped to
(B, S): "The shape of the mask [80, 1] at index 0 does not match the shape of the indexed
tensor [16, 5]"). The control reads the gather before any view: right. Standalone (torchrun, 2
gloo ranks) on torch 2.13.0 and 2.15.0, with and without loss_parallel(). Found by the ops
generator's `lp_logprobs` entry (round 3, 2026-12-07, seed lp1:
`lp_logprobs~2~f32~16x5x13,16x5,16x5~S-1,R,R~how=gather~132`). No upstream issue found
(searched: MaskPartial view / squeeze, gather mask shape). Draft:
reports/upstream-draft-dtensor-gather-mask-partial-view.md.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("read", ["squeezed", "gathered_control"])
def test_the_gathered_log_probs_of_vocab_sharded_logits_are_the_plain_ones(dist, read: str) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = dist.mesh()
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(4, 5, 13, generator=g), torch.randint(0, 13, (4, 5), generator=g)
    index = distribute_tensor(labels.unsqueeze(-1), mesh, [Replicate()])
    out = torch.gather(distribute_tensor(logits, mesh, [Shard(-1)]), 2, index)
    want = torch.gather(logits, 2, labels.unsqueeze(-1))
    if read == "squeezed":
        out, want = out.squeeze(-1), want.squeeze(-1)
    try:  # every rank applies the same mask to the same shapes: all raise alike, none waits
        got = out.full_tensor()
    except IndexError as exc:
        pytest.fail(f"gather of vocab-sharded logits ({read}, placements {out.placements}): reading it raised: "
                    f"{exc}")
    torch.testing.assert_close(got, want)
