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
