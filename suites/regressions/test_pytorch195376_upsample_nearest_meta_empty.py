"""Nearest interpolation of a zero-batch DTensor raises TypeError in its meta function (2 ranks).

Trigger: `F.interpolate(x, size=..., mode="nearest")` of a DTensor with no batch rows (a
replicated position embedding or feature map resized for an empty micro-batch, an expert that
got no token). DTensor propagates the op's sharding through its meta function, and
torch/_meta_registrations.py upsample_nearest2d guards with
`torch._check(input.numel() != 0 or multiply_integers(input.size()[1:]), ...)`: an int, so
torch._check raises "TypeError: cond must be a bool, but got <class 'int'>" where eager returns the
(0, C, H', W') result. Upstream: PR pytorch#195376 ("Give the nearest-upsample meta checks a boolean
predicate", open); torch 2.13.0 raises (CPU, gloo, 2026-12-07). Control: bilinear, whose meta
function has no such guard.

Found by the ops generator's second inventory round (reports/fuzz-ops-2026-12-10-inventory2.md),
shrunk to `interpolate~2~f32~0x1x1x1~R~mode=nearest,size=3~0`.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("mode", ["nearest", "bilinear"], ids=["nearest", "bilinear_control"])
def test_interpolate_of_a_zero_batch_dtensor(dist, mode: str) -> None:
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, distribute_tensor

    x = distribute_tensor(torch.zeros(0, 2, 2, 2).to(dist.device), dist.mesh(), [Replicate()])
    try:
        got = F.interpolate(x, size=(3, 3), mode=mode)
    except (RuntimeError, TypeError) as exc:
        pytest.fail(f"{mode} interpolation of a {tuple(x.shape)} DTensor raised: {str(exc).splitlines()[0]}")
    assert tuple(got.shape) == (0, 2, 3, 3)
