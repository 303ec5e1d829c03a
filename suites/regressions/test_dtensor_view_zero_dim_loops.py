"""DTensor view/reshape that merges a 0-long dim with the dims after it never returns.

Trigger: `x.reshape(2, -1)` / `x.flatten(1)` / `x.view(-1)` of a DTensor whose merged dims start
with a 0-long one, e.g. global shape (2, 0, 3) -> (2, 0) or (0, 3) -> (0,), any placement
(Replicate included). The plain op returns the empty tensor at once; DTensor's sharding
propagation loops forever in `view_groups` (torch/distributed/tensor/_ops/_view_ops.py: the
0-long group matches, then the next from-dim meets the end of the to-shape as a size-1 group and
is stepped back, again and again). It is a CPU spin on every rank, before any collective, so no
NCCL/gloo watchdog ever fires: the job just stops making progress. Merging where the 0 comes
last, (2, 3, 0) -> (2, 0), or keeping the 0 dim, (0, 4, 3) -> (0, 3), works. Where trainers meet
it: merging heads or flattening tokens of an empty batch or expert (`out.view(bs, seqlen, -1)`
after attention, `x.flatten(1)`), as the ops generator drew it:
`reshape_merge~4~f32~16x12x0x12~Pavg~-~962` (seed bench, fixes on, 2026-12-06; the sweep's
watchdog ended it after 300 s). Measured standalone on 2.13.0 and 2.15.0 (1 process, fake
group: still looping after 8 s, faulthandler in view_groups). Control: the same reshape of a
non-empty tensor. The test bounds the propagation with the ops generator's case bound (SIGALRM: the spin is
Python code, so the alarm's exception ends it; suites/generators/case_bound.py) and reports the
loop as a failure, never as a hang of the session.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks
from ..generators.case_bound import Bound, CaseTimeout

pytestmark = tier_marks("nightly")

BOUND_S = 20


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("shape,to", [((2, 0, 3), (2, -1)), ((0, 3), (-1,)), ((2, 4, 3), (2, -1))],
                         ids=["merge_after_zero", "flatten_empty", "nonempty_control"])
def test_reshape_returns(dist, shape, to) -> None:
    from torch.distributed.tensor import DTensor, Replicate

    x = torch.zeros(shape)
    xd = DTensor.from_local(x, dist.mesh(), [Replicate()], run_check=False)
    bound = Bound(BOUND_S)  # the ops generator's case bound: it names the function the call loops in
    try:
        with bound:
            got = xd.reshape(*to)
    except CaseTimeout:
        pytest.fail(f"DTensor reshape {shape} -> {to} did not return in {BOUND_S} s "
                    f"(sharding propagation looping in {bound.hit.where})")
    assert tuple(got.shape) == tuple(x.reshape(*to).shape)
