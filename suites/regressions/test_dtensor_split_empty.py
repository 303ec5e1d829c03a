"""DTensor split of a tensor with a 0-length split dim raises (no output spec for the one chunk).

Trigger: `torch.split(x, size, dim)` where x's split dim is 0 long: the plain op returns one
empty chunk, DTensor's strategy gives no output for it. Where trainers meet it: splitting an
empty batch of tokens (an expert or a microbatch that got no token: `tokens.split(n)` in a
per-expert loop) under tensor or data parallelism. torch 2.13.0 raises "For the op
aten::split.Tensor, `output_specs` has 0 outputs which does not equal the number of op outputs
1"; 2.15.0 raises "Strategy length 1 != expected 2 ... for aten.split.Tensor". Found by the ops
generator as `split~2x2~f32~6x11x0~R.Pavg~size=2,dim=2~211`, shrunk to
`split~2~f32~1x0~R~size=1,dim=-1~0` (seed bench, torch 2.13.0 CPU, fixes off, 2026-12-06).
Control: the same split of a non-empty tensor.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("tokens", [0, 4], ids=["no_tokens", "four_tokens_control"])
def test_split_matches_the_plain_op(dist, tokens: int) -> None:
    from torch.distributed.tensor import Replicate, distribute_tensor

    x = torch.randn(tokens, 4, generator=torch.Generator().manual_seed(0))
    xd = distribute_tensor(x, dist.mesh(), [Replicate()])
    try:
        got = [c.full_tensor() for c in torch.split(xd, 2, dim=0)]
    except RuntimeError as exc:
        pytest.fail(f"split of a ({tokens}, 4) DTensor raised: {exc}")
    want = torch.split(x, 2, dim=0)
    assert [tuple(c.shape) for c in got] == [tuple(c.shape) for c in want]
