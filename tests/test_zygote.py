"""One torch import per rank pool (distci.harness.zygote): the pool's ranks are forks of one
zygote, each with its own rank environment, dying with it; where a fork could not use the
device, each rank's template is spawned afresh under it."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from distci.harness import procs
from distci.harness.pool import RankPool
from distci.harness import protocol
from distci.harness.protocol import Warm

CASE = '''\
import os

IMPORT_RANK = os.environ.get("RANK")  # read at import time, as some test helpers do


def test_rank_env(dist):
    assert (IMPORT_RANK, os.environ.get("LOCAL_RANK")) == (str(dist.rank), str(dist.rank))


def test_kill_my_template(dist):
    if dist.rank == 1:
        os.kill(os.getppid(), 9)
'''


@pytest.fixture
def case_dir(tmp_path: Path) -> Path:
    (tmp_path / "zygote_case.py").write_text(CASE)
    return tmp_path


def _request(case_dir: Path, name: str) -> protocol.TestRequest:
    return protocol.TestRequest(f"zygote_case.py::{name}", "zygote_case", name, {}, [str(case_dir), str(REPO)])


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _pool(case_dir: Path, **kwargs) -> RankPool:
    pool = RankPool(2, "cpu", case_dir / "logs", start_timeout_s=120, **kwargs)
    pool.start(Warm(["zygote_case"], [str(case_dir), str(REPO)]))
    return pool


def test_the_ranks_share_one_import_and_each_reads_its_own_rank_at_import(case_dir: Path):
    """Each rank's keeper is a child of the one zygote and its worker a fork (the zygote's
    command line, no `python -m distci.harness.worker` of its own); the test module, imported
    ahead by each rank's template, read that rank's RANK and LOCAL_RANK at import time."""
    pool = _pool(case_dir)
    try:
        zygote = pool.zygote.pid
        keepers = [r.proc.pid for r in pool.ranks]
        assert [_ppid(k) for k in keepers] == [zygote, zygote]
        for r in pool.ranks:
            assert _ppid(r.worker_pid) == r.proc.pid
            assert "distci.harness.zygote" in _cmdline(r.worker_pid), _cmdline(r.worker_pid)
        assert sorted(pool.pids()) == sorted([zygote, *keepers])
        combined = pool.run(_request(case_dir, "test_rank_env"), timeout_s=120)
        assert combined.outcome == "passed", combined.message
    finally:
        pool.shutdown()
    assert pool.zygote is None


def test_a_rank_whose_template_dies_is_recorded_and_a_killed_zygote_takes_the_rest(case_dir: Path):
    pool = _pool(case_dir)
    try:
        combined = pool.run(_request(case_dir, "test_kill_my_template"), timeout_s=120)
        assert (combined.outcome, combined.failure_kind) == ("failed", "crash"), combined.message
        assert "rank 1" in combined.message and "SIGKILL" in combined.message, combined.message
        assert pool.ranks == [], "a lost template: the pool is rebuilt for the next test"

        pool.start(Warm(["zygote_case"], [str(case_dir), str(REPO)]))
        zygote = pool.zygote.pid
        tree = procs.descendants(zygote)
        assert len(tree) >= 6, tree  # per rank: its keeper, the worker, the spare fork
        os.kill(zygote, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and [p for p in tree if Path(f"/proc/{p}").exists()]:
            time.sleep(0.1)
        assert [p for p in tree if Path(f"/proc/{p}").exists() and _state(p) != "Z"] == []
        assert [r.proc.wait(timeout=10) for r in pool.ranks] == [-signal.SIGKILL] * 2
        assert not pool.alive
    finally:
        pool.kill()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


STANDIN = '''\
import sys, types
import torch
from distci.harness import devices, zygote

# A device whose runtime `import torch` started (a CUDA context in the zygote): no fork of it
# could use the device. The ranks' fresh workers see the real cpu kind.
torch.standin = types.SimpleNamespace(is_initialized=lambda: True, _is_in_bad_fork=lambda: False)
devices.device_kind = lambda name: devices.DeviceKind("cpu", "gloo", "standin")
sys.exit(zygote.main(sys.argv[sys.argv.index("distci.harness.zygote") + 1:]))
'''


@pytest.mark.slow
def test_where_a_fork_could_not_use_the_device_each_rank_is_spawned_afresh(case_dir: Path):
    script = case_dir / "standin.py"
    script.write_text(STANDIN)
    python = case_dir / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    pool = _pool(case_dir, python=str(python), env={"PYTHONPATH": str(REPO)})
    try:
        for r in pool.ranks:
            assert _ppid(r.proc.pid) == pool.zygote.pid
            assert "distci.harness.worker" in _cmdline(r.worker_pid), _cmdline(r.worker_pid)
        log = (case_dir / "logs" / "ws2-zygote.log").read_text()
        assert "template is spawned afresh" in log and "initialized in the zygote" in log, log
        combined = pool.run(_request(case_dir, "test_rank_env"), timeout_s=120)
        assert combined.outcome == "passed", combined.message
    finally:
        pool.shutdown()


def test_a_pool_shut_down_before_its_warm_message_forks_no_rank(case_dir: Path):
    """Pools launched ahead are shut down when no selected test needs them: the zygote, still
    waiting for what to import, ends by itself (exit 0, not the kill after the grace)."""
    pool = RankPool(2, "cpu", case_dir / "logs", start_timeout_s=120)
    pool.launch()
    zygote = pool.zygote
    pool.shutdown(timeout_s=120)
    assert zygote.proc.returncode == 0
    assert zygote.forked == {}
