"""Rank pools of several (world size, process-group timeout) classes in one session: each
test counts the rank workers of this session that are up and checks them against the cap
(DISTCI_MAX_LIVE_RANKS, set by tests/test_harness.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _live_workers() -> int:
    """Rank workers of this session: each is a tree (a keeper, the worker, the forks that run
    tests) of processes with the worker's command line; only the tree's root is counted."""
    token = os.environ["DISTCI_TEST_TOKEN"].encode()
    workers: dict[int, int] = {}  # pid -> parent pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"distci.harness.worker" in (entry / "cmdline").read_bytes() and \
                    b"DISTCI_TEST_TOKEN=" + token in (entry / "environ").read_bytes():
                workers[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return sum(parent not in workers for parent in workers.values())


def _check(dist) -> None:
    if dist.rank == 0:
        cap = int(os.environ["DISTCI_MAX_LIVE_RANKS"])
        live = _live_workers()
        assert dist.world_size <= live <= cap, f"{live} rank workers up, the cap is {cap}"


@pytest.mark.world_size(2)
def test_default_class(dist):
    _check(dist)


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(900)
def test_long_class(dist):
    _check(dist)


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(1800)
def test_longer_class(dist):
    _check(dist)


@pytest.mark.world_size(1)
def test_one_rank(dist):
    _check(dist)


@pytest.mark.world_size(2)
def test_default_class_again(dist):
    _check(dist)
