"""Tests that never finish on their own: test_harness.py stops the run while they sleep."""

import time

import pytest


@pytest.mark.world_size(2)
def test_finishes(dist):
    assert dist.world_size == 2


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(3600)
def test_sleeps_in_the_pool(dist):
    time.sleep(3600)


@pytest.mark.torchrun(nproc=2)
@pytest.mark.dist_timeout(3600)
def test_sleeps_under_torchrun(dist):
    time.sleep(3600)
