"""Fault cases that leave processes behind: each rank starts a child, which starts a
grandchild in a session of its own (`start_new_session=True`, as daemons do), then
everything sleeps. tests/test_faults_stops.py stops or kills the controller meanwhile and
checks that no process carrying the run's token survives.

`DISTCI_FAULT_DIR`, when set, is where each rank says it is ready.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

_GRANDCHILD = "import time; time.sleep(3600)"
_CHILD = (
    "import subprocess, sys, time; "
    f"subprocess.Popen([sys.executable, '-c', {_GRANDCHILD!r}], start_new_session=True); "
    "time.sleep(3600)"
)


def _spawn_and_sleep(rank: int, tmp_path: Path) -> None:
    subprocess.Popen([sys.executable, "-c", _CHILD])
    ready = Path(os.environ.get("DISTCI_FAULT_DIR") or tmp_path)
    time.sleep(1.0)  # the child has had time to start its grandchild
    (ready / f"ready-rank{rank}").write_text(str(os.getpid()))
    time.sleep(3600)


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(3600)
def test_pool_rank_leaves_processes(dist, tmp_path):
    _spawn_and_sleep(dist.rank, tmp_path)


@pytest.mark.torchrun(nproc=2)
@pytest.mark.dist_timeout(3600)
def test_torchrun_rank_leaves_processes(dist, tmp_path):
    _spawn_and_sleep(dist.rank, tmp_path)


@pytest.mark.world_size(2)
def test_rank_leaves_processes_and_passes(dist, tmp_path):
    """A passing test whose rank leaves a child and a setsid grandchild: they die with the test."""
    subprocess.Popen([sys.executable, "-c", _CHILD])
    time.sleep(1.0)


@pytest.mark.world_size(2)
def test_after_leaves_processes(dist):
    """Nothing the previous test started is still under this rank's worker (a child subreaper,
    of which this test's process is a fresh fork)."""
    from distci.harness import procs

    others = [pid for pid in procs.descendants(os.getppid()) if pid != os.getpid()]
    assert others == [], f"rank {dist.rank}'s worker still has the last test's processes: {others}"


_ESCAPEE = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(3600)"


@pytest.mark.world_size(2)
def test_rank_kills_its_worker_leaving_a_tokenless_daemon(dist, tmp_path):
    """Rank 1 starts a daemon in a session of its own with an empty environment (no run token
    finds it), then kills its own worker: the daemon still dies with the test (the worker's
    keeper adopts it)."""
    if dist.rank == 1:
        where = Path(os.environ.get("DISTCI_FAULT_DIR") or tmp_path) / "daemon.pid"
        # A rerun finds the last attempt's file: wait for this attempt's daemon, not that one's pid
        # (the worker killed before the new daemon wrote its pid left the file empty under load).
        where.unlink(missing_ok=True)
        subprocess.Popen([sys.executable, "-c", _ESCAPEE, str(where)], start_new_session=True, env={})
        while not where.exists() or not where.read_text():
            time.sleep(0.05)
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)


@pytest.mark.world_size(2)
def test_after_kills_its_worker(dist):
    import torch
    import torch.distributed as d

    t = torch.ones(1, device=dist.device)
    d.all_reduce(t)
    assert t.item() == dist.world_size
