"""procs' view of a runner's load and of a process's progress, which decide whether a
timeout was the machine's (rerun with a longer budget) or the test's."""

from __future__ import annotations

import subprocess
import sys

from distci.harness import procs
from distci.harness.outcome import RankState
from distci.harness.pool import load_at_timeout


def test_a_computing_process_advances_and_a_sleeping_one_does_not() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "print('up', flush=True)\nwhile True: pass"], stdout=subprocess.PIPE)
    idle = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE)
    try:
        for proc in (busy, idle):  # past the interpreter's start-up, which uses CPU
            assert proc.stdout.readline() == b"up\n"
        advancing = procs.cpu_advancing([busy.pid, idle.pid], window_s=1.0)
    finally:
        for proc in (busy, idle):
            proc.kill()
            proc.wait()
    assert advancing == {busy.pid: True, idle.pid: False}


def test_the_runner_is_saturated_from_one_runnable_task_per_cpu(monkeypatch) -> None:
    monkeypatch.setattr(procs.os, "getloadavg", lambda: (4.0, 3.0, 2.0))
    monkeypatch.setattr(procs.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert procs.runner_load() == {"load1": 4.0, "load5": 3.0, "load15": 2.0, "cpus": 4, "saturated": True}
    monkeypatch.setattr(procs.os, "sched_getaffinity", lambda _pid: set(range(8)))
    assert not procs.runner_load()["saturated"]
    monkeypatch.setenv(procs.SATURATED_ENV, "0.25")
    assert procs.runner_load()["saturated"]


COLLECTIVE_STACK = ('Current thread 0x1 (most recent call first):\n'
                    '  File "/x/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n')
COMPUTE_STACK = 'Current thread 0x1 (most recent call first):\n  File "/x/suites/step.py", line 9 in forward\n'


def test_only_a_rank_computing_outside_a_collective_is_progress() -> None:
    waiting = RankState(0, stuck=True, stack=COLLECTIVE_STACK)
    computing = RankState(1, stuck=True, stack=COMPUTE_STACK)
    load = load_at_timeout([waiting, computing], {0: True, 1: True})
    assert load["progressing"] and load["computing_ranks"] == [1]
    assert not load_at_timeout([waiting, computing], {0: True, 1: False})["progressing"]
