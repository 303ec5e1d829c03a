"""procs' view of a runner's load and of a process's progress, which decide whether a
timeout was the machine's (rerun with a longer budget) or the test's."""

from __future__ import annotations

import subprocess
import sys

from distci.harness import machine, procs
from distci.harness.outcome import RankState
from distci.harness.timeouts import load_at_timeout


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
    monkeypatch.setattr(machine.os, "getloadavg", lambda: (4.0, 3.0, 2.0))
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert machine.runner_load() == {"load1": 4.0, "load5": 3.0, "load15": 2.0, "cpus": 4, "saturated": True}
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda _pid: set(range(8)))
    assert not machine.runner_load()["saturated"]
    monkeypatch.setenv(machine.SATURATED_ENV, "0.25")
    assert machine.runner_load()["saturated"]


COLLECTIVE_STACK = ('Current thread 0x1 (most recent call first):\n'
                    '  File "/x/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n')
COMPUTE_STACK = 'Current thread 0x1 (most recent call first):\n  File "/x/suites/runner/step.py", line 9 in forward\n'


SHARDING_STACK = ('Current thread 0x1 (most recent call first):\n'
                  '  File "/x/torch/distributed/tensor/_collective_utils.py", line 550 in redistribute_cost\n'
                  '  File "/x/torch/distributed/tensor/_sharding_prop.py", line 780 in propagate_op_sharding_non_cached\n')


def test_a_rank_in_dtensor_sharding_propagation_is_computing_not_waiting() -> None:
    """Seen in the pr tier at load 45 (tp-eager-f8_rowwise): both ranks busy in DTensor's
    sharding propagation, under torch/distributed/, which is work, not a wait for a peer."""
    load = load_at_timeout([RankState(0, stuck=True, stack=SHARDING_STACK)], {0: True})
    assert load["progressing"] and load["computing_ranks"] == [0]


def test_only_a_rank_computing_outside_a_collective_is_progress() -> None:
    waiting = RankState(0, stuck=True, stack=COLLECTIVE_STACK)
    computing = RankState(1, stuck=True, stack=COMPUTE_STACK)
    load = load_at_timeout([waiting, computing], {0: True, 1: True})
    assert load["progressing"] and load["computing_ranks"] == [1]
    assert not load_at_timeout([waiting, computing], {0: True, 1: False})["progressing"]


def test_an_oom_kill_is_told_by_the_cgroup_the_kernel_log_or_the_peak_rss(monkeypatch, tmp_path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    monkeypatch.setattr(machine, "_cgroup_file", lambda v2, _c, _v1: events if v2 == "memory.events" else None)
    monkeypatch.setattr(machine, "_kernel_log_oom", lambda pid: "")
    monkeypatch.setattr(machine, "memory_limit", lambda: 8 * 2**30)
    assert machine.oom_kills() == 1
    assert machine.oom_evidence(42, 0, kills_before=0) == "the cgroup's oom_kill count went from 0 to 1"
    assert machine.oom_evidence(42, 0, kills_before=1) == ""  # no new kill: a SIGKILL someone else sent
    assert machine.oom_evidence(42, int(7.8 * 2**20), kills_before=1) == (
        "its peak RSS 7.8 GiB was 97% of the 8.0 GiB memory limit")
    monkeypatch.setattr(machine, "_kernel_log_oom", lambda pid: f"Out of memory: Killed process {pid} (python)")
    assert machine.oom_evidence(42, 0, kills_before=1) == "the kernel log: Out of memory: Killed process 42 (python)"


def test_a_rank_the_oom_killer_took_is_recorded_as_oom_not_a_bare_sigkill() -> None:
    from distci.harness.outcome import combine
    from distci.harness.protocol import RankReport

    peer = RankState(0, report=RankReport(0, "failed", kind="exception", message="Connection closed by peer"))
    killed = RankState(1, exit_code=-9, oom="the cgroup's oom_kill count went from 0 to 1")
    combined = combine([peer, killed], 1.0)
    assert (combined.outcome, combined.failure_kind, combined.exc_type) == ("failed", "crash", "RankOOM")
    assert combined.message == ("rank 1 was killed by the kernel's OOM killer (SIGKILL; the cgroup's oom_kill "
                                "count went from 0 to 1)")
    plain = combine([peer, RankState(1, exit_code=-9)], 1.0)
    assert plain.exc_type == "RankCrash" and plain.message == "rank 1 killed by SIGKILL"
