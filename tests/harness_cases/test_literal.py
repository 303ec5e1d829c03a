"""Test ids and messages with rich-markup-like brackets: the terminal must print them as they are."""

import pytest


@pytest.mark.world_size(2)
@pytest.mark.parametrize("dtype", ["[bold]float32[/bold]"])
def test_known_break(dist, dtype):
    raise RuntimeError("upstream break [red]kept literally[/red]")


@pytest.mark.world_size(2)
def test_passes(dist):
    assert dist.world_size == 2
