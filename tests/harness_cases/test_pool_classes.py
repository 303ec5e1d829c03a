"""Rank pools of several world sizes and process-group timeout classes in one session: each
test counts the rank workers of this session that are up and checks them against the cap
(DISTCI_MAX_LIVE_RANKS=5, set by tests/test_harness.py), and checks that its own process group
has its class's timeout (the harness's pg_timeout_of: the default 300 s test -> 240 s, a
900 s marker -> 840 s, 1800 s -> 1740 s), whichever pool serves it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def _live_workers() -> int:
    """Rank workers of this session. A pool is a tree of processes with the pool's command
    lines: its zygote (whose --ranks names every rank it forks: a pool launched ahead may not
    have forked them yet, but they are up as far as the cap goes), under it one process per
    rank (each a keeper, the worker, the forks that run tests)."""
    token = os.environ["DISTCI_TEST_TOKEN"].encode()
    ranks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"distci.harness.zygote" in argv and b"DISTCI_TEST_TOKEN=" + token in (entry / "environ").read_bytes():
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if b"distci.harness.zygote" not in Path(f"/proc/{parent}/cmdline").read_bytes():
                    ranks += len(json.loads(argv[argv.index(b"--ranks") + 1]))
        except (OSError, ValueError, IndexError):
            continue
    return ranks


def _check(dist, pg_timeout_s: float, live: int | None = None) -> None:
    import torch
    import torch.distributed as d

    timeout = d.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    assert timeout == pg_timeout_s, f"this test's process group has a {timeout} s timeout, its class {pg_timeout_s} s"
    if dist.rank == 0:
        cap = int(os.environ["DISTCI_MAX_LIVE_RANKS"])
        found = _live_workers()
        assert dist.world_size <= found <= cap, f"{found} rank workers up, the cap is {cap}"
        if live is not None:
            assert found == live, f"{found} rank workers up, expected {live}"


@pytest.mark.world_size(2)
def test_default_class(dist):
    _check(dist, 240.0, live=5)  # the 3-rank pool was launched ahead beside this one; no 1-rank pool (below)


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(900)
def test_long_class(dist):
    _check(dist, 840.0, live=5)  # served by the same pool: no pool per class


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(1800)
def test_longer_class(dist):
    _check(dist, 1740.0, live=5)


@pytest.mark.world_size(1)
@pytest.mark.skip(reason="a skipped test needs no pool")
def test_skipped_one_rank(dist):
    raise AssertionError("skipped")


@pytest.mark.world_size(1)
@pytest.mark.requires_accelerator("npu")
def test_one_rank_on_another_accelerator(dist):
    raise AssertionError("skipped on cpu")


@pytest.mark.world_size(3)
def test_three_ranks(dist):
    _check(dist, 240.0, live=5)


@pytest.mark.world_size(4)
def test_four_ranks(dist):
    _check(dist, 240.0, live=4)  # both idle pools were shut down to make room


@pytest.mark.world_size(2)
def test_default_class_again(dist):
    _check(dist, 240.0, live=2)
