"""Fault cases for --distci-reruns: one test fails once then passes, one always fails."""

from pathlib import Path

import pytest


@pytest.mark.world_size(2)
def test_fails_first_time(dist, tmp_path):
    marker = Path(tmp_path) / f"attempted-rank{dist.rank}"
    first = not marker.exists()
    marker.write_text("1")
    assert not first, f"first attempt on rank {dist.rank}"


@pytest.mark.world_size(2)
def test_always_fails(dist):
    assert dist.rank < 0, f"rank {dist.rank} fails every time"


@pytest.mark.world_size(2)
def test_after_reruns(dist):
    assert dist.world_size == 2
