"""What the runner's kernel says about the machine a run shares: its load (is a timeout the
machine's or the test's?), its memory limit and the OOM killer's kills (was a SIGKILL the
kernel's?). Read from /proc and the cgroup files, as procs.py reads process trees."""

from __future__ import annotations

import os
from pathlib import Path


SATURATED_ENV = "DISTCI_SATURATED_LOAD_PER_CPU"  # default 1.0; 0 counts every runner as saturated (tests)


def runner_load() -> dict[str, float]:
    """The machine's load: 1, 5 and 15 minute load averages and the CPUs this process may use;
    `saturated` when the 1-minute load is at least $DISTCI_SATURATED_LOAD_PER_CPU (default 1)
    runnable tasks per CPU."""
    try:
        load1, load5, load15 = os.getloadavg()
    except OSError:
        load1 = load5 = load15 = 0.0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"load1": round(load1, 2), "load5": round(load5, 2), "load15": round(load15, 2), "cpus": cpus,
            "saturated": load1 >= cpus * float(os.environ.get(SATURATED_ENV) or 1.0)}


def _cgroup_file(v2_name: str, v1_controller: str, v1_name: str) -> Path | None:
    """This process's cgroup file: `v2_name` in the unified hierarchy, else `v1_name` in the
    cgroup v1 `v1_controller` hierarchy; None where neither is readable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "" and (Path("/sys/fs/cgroup") / path.lstrip("/") / v2_name).is_file():
            return Path("/sys/fs/cgroup") / path.lstrip("/") / v2_name
        if v1_controller in controllers.split(","):
            candidate = Path("/sys/fs/cgroup") / v1_controller / path.lstrip("/") / v1_name
            if candidate.is_file():
                return candidate
    return None


def oom_kills() -> int | None:
    """The OOM killer's kills in this process's cgroup so far (cgroup v2 memory.events or v1
    memory.oom_control `oom_kill`); None where the cgroup does not say."""
    path = _cgroup_file("memory.events", "memory", "memory.oom_control")
    try:
        for line in path.read_text().splitlines() if path else []:
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def memory_limit() -> int | None:
    """Bytes this process's cgroup may use (memory.max / memory.limit_in_bytes), else the machine's RAM."""
    path = _cgroup_file("memory.max", "memory", "memory.limit_in_bytes")
    try:
        value = path.read_text().strip() if path else "max"
        if value != "max" and int(value) < 1 << 60:  # v1 writes "no limit" as a huge number
            return int(value)
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _kernel_log_oom(pid: int) -> str:
    """The kernel log's line saying the OOM killer killed `pid`, where /dev/kmsg is readable."""
    found = ""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not record:
                break
            message = record.split(";", 1)[-1].strip()
            if f"Killed process {pid} " in message or (f"pid={pid}," in message and "oom" in message.lower()):
                found = message
    finally:
        os.close(fd)
    return found


def oom_evidence(pid: int, max_rss_kb: int = 0, kills_before: int | None = None) -> str:
    """Why a SIGKILLed `pid` was the OOM killer's, in words naming the evidence; "" when none
    says so. In order: the cgroup's oom_kill count rose during the test, the kernel log
    names the pid, or its peak RSS came within 10% of the memory limit."""
    kills = oom_kills()
    if kills_before is not None and kills is not None and kills > kills_before:
        return f"the cgroup's oom_kill count went from {kills_before} to {kills}"
    line = _kernel_log_oom(pid)
    if line:
        return f"the kernel log: {line[:300]}"
    limit = memory_limit()
    if max_rss_kb and limit and max_rss_kb * 1024 >= 0.9 * limit:
        return (f"its peak RSS {max_rss_kb / 2**20:.1f} GiB was {100 * max_rss_kb * 1024 / limit:.0f}% "
                f"of the {limit / 2**30:.1f} GiB memory limit")
    return ""
