"""Timeouts that know the machine.

A test's deadline is a statement about the test only when the machine gave it its share:
on a runner at load 75 with 2 cores, a row that takes 1m44s alone hits a 5-minute timeout.
So a timeout is judged with the runner's load (machine.runner_load) and whether its ranks
were still making progress (procs.cpu_advancing; a rank blocked in a collective uses no
CPU): a load-timeout runs once more with a budget scaled by the load before it counts, and
the Result records the load. A rank stuck in a collective is a hang however loaded the
runner. Users' own pytest-timeout markers are taken over as distci's per-test timeout.
"""

from __future__ import annotations

from typing import Callable

import pytest

from distci.harness import machine
from distci.harness.outcome import RankState, waiting_in_collective

LOAD_RETRY_FACTOR = 3.0
LOAD_RETRY_MAX_FACTOR = 40.0
"""A timeout on a saturated runner whose ranks were still computing is run once more before
it counts, with its budget times the runner's load per CPU (at least LOAD_RETRY_FACTOR, at
most LOAD_RETRY_MAX_FACTOR): a test that got 1/20 of a CPU needs 20 times its wall time
(issue 41: a 1m44s row hit its timeout at load 75 on 2 cores)."""


def load_retry_factor(load: dict) -> float:
    per_cpu = float(load.get("load1") or 0) / max(1, int(load.get("cpus") or 1))
    return min(LOAD_RETRY_MAX_FACTOR, max(LOAD_RETRY_FACTOR, per_cpu))


USER_TIMEOUT = pytest.StashKey[float]()  # a distributed test's pytest-timeout marker value, taken over


def take_over_timeout_markers(items: list[pytest.Item], distributed: Callable[[pytest.Item], bool]) -> None:
    """A distributed test's `@pytest.mark.timeout(N)` becomes distci's per-test timeout. In
    the controller pytest-timeout would time the controller's wait for the ranks (raising
    there while the ranks run on, or `os._exit`ing the whole session); a closer
    `timeout(0)` marker switches it off for the test, and the ranks' deadline applies."""
    for item in items:
        marker = item.get_closest_marker("timeout")
        if marker is None or not distributed(item):
            continue
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if value is not None and float(value) > 0:
            item.stash[USER_TIMEOUT] = float(value)
        item.add_marker(pytest.mark.timeout(0), append=False)


def load_at_timeout(states: list[RankState], progress: dict[int, bool]) -> dict:
    """The runner's load when a test ran out of time, and whether its ranks were still making
    progress: CPU time advancing on a stuck rank whose main thread is not blocked in a collective
    call (a rank waiting for a peer that never comes uses none; one in DTensor's sharding
    propagation, under torch/distributed/ too, is computing)."""
    computing = [s.rank for s in states if s.stuck and progress.get(s.rank) and not waiting_in_collective(s.stack)]
    return dict(machine.runner_load(), progressing=bool(computing), computing_ranks=computing)


def describe_load(load: dict) -> str:
    return f"load {load.get('load1')} on {load.get('cpus')} CPUs, rank(s) {load.get('computing_ranks')} still computing"
