"""The baseline `nox -s bench -- harness` measures the rank pool against: plain
`torchrun --nproc-per-node N -m pytest -p distci.bench.plain`, every rank running every test
in one process with one process group and nothing isolated (what a project without distci
runs). This plugin gives the harness's tests their `dist` argument and markers there.
"""

from __future__ import annotations

import os

import pytest

from distci.harness.context import DistContext
from distci.harness.plugin import MARKERS


def pytest_configure(config: pytest.Config) -> None:
    import torch.distributed as dist

    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # torchrun's environment: MASTER_ADDR, RANK, WORLD_SIZE


@pytest.fixture
def dist() -> DistContext:
    import torch.distributed as d

    return DistContext(rank=d.get_rank(), world_size=d.get_world_size(), device_type="cpu", backend="gloo",
                       local_rank=int(os.environ.get("LOCAL_RANK", "0")), group=d.group.WORLD)
