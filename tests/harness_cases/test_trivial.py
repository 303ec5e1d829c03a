"""Twenty trivial 2-rank tests: the harness benchmark's workload (pool vs torchrun)."""

import pytest


@pytest.mark.world_size(2)
@pytest.mark.parametrize("i", range(20))
def test_trivial(dist, i):
    import torch
    import torch.distributed as d

    t = torch.tensor([float(i)], device=dist.device)
    d.all_reduce(t)
    assert t.item() == 2.0 * i
