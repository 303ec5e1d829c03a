"""Distributed cases driven by tests/test_harness.py (collected only when it asks).

Each misbehaving case is followed by a healthy one, to prove the pool recovers.
"""

import os
import time

import pytest


def _check_allreduce(dist):
    import torch
    import torch.distributed as d

    t = torch.ones(2, device=dist.device) * (dist.rank + 1)
    d.all_reduce(t)
    expected = dist.world_size * (dist.world_size + 1) / 2
    assert t.tolist() == [expected, expected]


@pytest.mark.world_size(2)
def test_allreduce(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
def test_rank_assert(dist):
    assert dist.rank == 0, f"rank {dist.rank} disagrees"


@pytest.mark.world_size(2)
def test_after_assert(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(8)
def test_hang(dist):
    import torch
    import torch.distributed as d

    if dist.rank == 0:
        t = torch.ones(1, device=dist.device)
        d.all_reduce(t)
        t.item()  # NCCL collectives are asynchronous: wait for the result, as training does
    else:
        time.sleep(3600)


@pytest.mark.world_size(2)
def test_after_hang(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
def test_crash(dist):
    import torch
    import torch.distributed as d

    if dist.rank == 1:
        os._exit(13)
    d.all_reduce(torch.ones(1, device=dist.device))


@pytest.mark.world_size(2)
def test_after_crash(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
def test_segfault(dist):
    import ctypes

    if dist.rank == 1:
        ctypes.string_at(0)


@pytest.mark.world_size(2)
def test_after_segfault(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(5)
def test_slow(dist):
    time.sleep(3600)


@pytest.mark.world_size(2)
def test_after_slow(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("n", [1, 3])
def test_param(dist, n, tmp_path):
    assert n in (1, 3)
    assert tmp_path.exists()


@pytest.mark.world_size(2)
def test_skip(dist):
    pytest.skip("not on this rank setup")


@pytest.mark.world_size(3)
def test_three_ranks(dist):
    _check_allreduce(dist)


def test_plain_in_controller():
    assert 1 + 1 == 2
