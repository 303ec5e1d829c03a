"""A test that owns its process group, launched by torchrun."""

import pytest


@pytest.mark.torchrun(nproc=2)
def test_own_group(dist):
    import torch
    import torch.distributed as d

    assert not d.is_initialized()
    dist.init()
    t = torch.ones(1, device=dist.device) * (dist.rank + 1)
    d.all_reduce(t)
    assert t.item() == 3.0
    d.destroy_process_group()


@pytest.mark.torchrun(nproc=2)
@pytest.mark.dist_timeout(3600)
def test_marker_timeout_is_capped(dist):
    """Runs only with --distci-timeout-cap: a marker sized for slow runners, capped."""
    import time

    time.sleep(3600)
