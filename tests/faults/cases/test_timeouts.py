"""Fault cases for timeouts that know the machine (run by tests/test_faults_state.py with
DISTCI_SATURATED_LOAD_PER_CPU=0, so the runner counts as saturated whatever its load).

- `test_slow_only_the_first_time`: its first attempt computes past its 4 s budget (CPU time
  advancing, no collective): a load-timeout, run again with a budget times the load per CPU (>= 3x), where it passes;
- `test_stuck_in_a_collective`: rank 0 waits for a collective rank 1 never joins: no
  progress, so a `hang` at once, never run again however loaded the runner;
- `test_pytest_timeout_marker`: pytest-timeout's `@pytest.mark.timeout(3)` is distci's
  per-test timeout (a `timeout` after ~3 s; the ranks killed, the controller untouched).
"""

import os
import time

import pytest
from faults_compute import compute_until
from faults_memo import recall, remember


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(4)
def test_slow_only_the_first_time(dist):
    try:
        recall("slow-first", dist.rank)
        return
    except KeyError:
        remember("slow-first", dist.rank, os.getpid())
    compute_until(time.monotonic() + 30)  # pure compute: the CPU time of the rank advances


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(4)
def test_stuck_in_a_collective(dist):
    import torch
    import torch.distributed as d

    if dist.rank == 0:
        d.all_reduce(torch.ones(1, device=dist.device))


@pytest.mark.world_size(2)
@pytest.mark.timeout(3)
def test_pytest_timeout_marker(dist):
    time.sleep(60)


@pytest.mark.world_size(2)
def test_after_timeouts(dist):
    import torch
    import torch.distributed as d

    t = torch.ones(1, device=dist.device)
    d.all_reduce(t)
    assert t.item() == dist.world_size
