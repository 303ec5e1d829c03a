"""The pieces behind the fault suite, in-process: frame-based hang detection, global-state
restore, process-group timeout classes, run tokens and the reaper."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import pytest

from conftest import REPO
from distci.harness import procs
from distci.harness.outcome import RankState, combine, in_collective
from distci.run.cellrun import QUIET_PLUGINS

FAULTHANDLER_SPIN = """Current thread 0x00007f (most recent call first):
  File "/repo/tests/faults/cases/test_pool_faults.py", line 77 in test_broadcast_spin
  File "/repo/distci/harness/execute.py", line 45 in execute
"""
FAULTHANDLER_COLLECTIVE = """Current thread 0x00007f (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/repo/tests/test_x.py", line 9 in test_plain
"""
PYSPY_COLLECTIVE = """Thread 4242 (idle): "MainThread"
    wait (torch/distributed/_functional_collectives.py:140)
    test_plain (tests/test_x.py:9)
"""


@pytest.mark.parametrize("stack, expected", [
    (FAULTHANDLER_SPIN, False),
    (FAULTHANDLER_COLLECTIVE, True),
    (PYSPY_COLLECTIVE, True),
    ('Current thread 0x1 (most recent call first):\n  File "/repo/all_reduce_broadcast_barrier.py", line 1 in broadcast\n', False),
])
def test_only_torch_distributed_files_count_as_a_collective(stack, expected):
    assert in_collective(stack) is expected


def test_a_spin_in_a_test_named_broadcast_is_a_timeout():
    states = [RankState(r, stuck=True, stack=FAULTHANDLER_SPIN) for r in (0, 1)]
    assert combine(states, 4.0).failure_kind == "timeout"
    states[0].stack = FAULTHANDLER_COLLECTIVE
    assert combine(states, 4.0).failure_kind == "hang"


def test_every_rank_excerpt_names_its_rank():
    states = [RankState(0, stuck=True, stack=FAULTHANDLER_COLLECTIVE, log="zero"), RankState(1, exit_code=-11, log="one")]
    combined = combine(states, 1.0)
    assert [r.excerpt.split()[:2] for r in combined.ranks] == [["rank", "0"], ["rank", "1"]]


def test_pg_timeout_classes_follow_the_marker():
    from distci.harness.plugin import Harness

    h = Harness.__new__(Harness)
    h.default_timeout = 300.0
    assert h.pg_timeout_of(8) == h.pg_timeout_of(300) == 240.0  # short tests share the default class
    assert h.pg_timeout_of(900) == 840.0 and h.pg_timeout_of(900) < 900
    h.default_timeout = 12.0
    assert (h.pg_timeout_of(12), h.pg_timeout_of(40)) == (9.0, 30.0)


def test_run_token_extends_the_callers(monkeypatch):
    monkeypatch.setenv(procs.RUN_TOKEN_ENV, "caller")
    token = procs.run_token()
    assert token.startswith("caller.") and token != procs.run_token()
    monkeypatch.delenv(procs.RUN_TOKEN_ENV)
    assert "." not in procs.run_token()


def test_reaper_kills_token_carriers_when_its_controller_dies(tmp_path):
    """A controller (here a child python) starts a reaper and a setsid sleeper carrying the
    token, then is SIGKILLed: the sleeper is gone soon after. The sleeper says it is up
    first: Popen returns while the kernel is still in the child's exec, when its
    /proc/PID/environ reads empty for a moment (seen 1 in 12 under xdist)."""
    token = uuid.uuid4().hex
    script = (
        "import os, subprocess, sys, time\n"
        "from distci.harness import procs\n"
        f"r = procs.Reaper({token!r})\n"
        f"env = dict(os.environ, {procs.RUN_TOKEN_ENV}={token!r})\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; print(1, flush=True); time.sleep(600)'],\n"
        "                     env=env, start_new_session=True, stdout=subprocess.PIPE)\n"
        "p.stdout.readline()\n"  # past its exec: until then its environ reads empty
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    controller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    assert controller.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
    assert len(procs.with_token(token)) == 1
    controller.kill()
    controller.wait()
    deadline = time.monotonic() + 15
    while procs.with_token(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert procs.with_token(token) == []


def _sleeper(**kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], **kwargs)


def test_a_group_is_killed_without_reaching_a_reused_number():
    """Once a group's leader was waited for, its number is free (pid_max is 32768 here and a
    test suite wraps it): kill_group then kills the group's survivors, and never a process
    that now holds the number and leads a group of its own (the reaper test lost its
    setsid sleeper to a stale killpg of another test's bisect command)."""
    leader = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', "
                               "'import time; time.sleep(600)']).pid, flush=True)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    survivor = int(leader.stdout.readline())  # type: ignore[union-attr]
    leader.wait()
    stranger = _sleeper(start_new_session=True)
    try:
        procs.kill_group(leader)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{survivor}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{survivor}").exists(), "the group's survivor outlived kill_group"
        # The stranger's Popen, as if a process of the same number had been waited for
        # earlier: the number leads a live group, which is not the one that was meant.
        reused = subprocess.Popen.__new__(subprocess.Popen)
        reused.pid, reused.returncode = stranger.pid, 0
        procs.kill_group(reused)
        procs.kill_tree(reused)
        time.sleep(0.2)
        assert stranger.poll() is None, "a stale number's new owner was killed"
    finally:
        stranger.kill()
        stranger.wait()


def test_an_unknown_fix_id_stops_import_torch_naming_the_known_ids(monkeypatch):
    """The entry point torch calls at `import torch` raises for a typo (torch aborts the
    import with it as the cause): in a cell env, not only under the harness, a typo is an
    error, never a RuntimeWarning with the other fixes applied."""
    sys.path.insert(0, str(REPO / "fixes"))
    try:
        from distci_fixes import UnknownFixError
        from distci_fixes._autoload import autoload
    finally:
        sys.path.remove(str(REPO / "fixes"))
    monkeypatch.setenv("DISTCI_FIXES", "act_tangent_coercion,nonexistent")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning instead of the error
        with pytest.raises(UnknownFixError, match="unknown fix id nonexistent; known ids: act_tangent_coercion"):
            autoload()
        monkeypatch.setenv("DISTCI_FIXES", "none")
        autoload()


@pytest.mark.parametrize("value, fixes", [("none", ["off"]), ("NONE", ["off"]), ("all", ["on"]), ("", ["on", "off"])])
def test_distci_fixes_overrides_the_cells_mode_and_its_id(value, fixes):
    from distci.matrix import load_matrix
    from distci.run.cellrun import cell_environment
    from distci.run.fixesmode import fixes_override

    cells = [c for c in load_matrix(REPO / "matrix.toml").cells if c.accelerator == "cpu"][:1]
    twin = [c for c in load_matrix(REPO / "matrix.toml").cells if c.id == cells[0].id.replace("fix_on", "fix_off")]
    chosen = fixes_override(cells + twin, {"DISTCI_FIXES": value} if value else {})
    assert sorted(c.fixes for c in chosen) == sorted(fixes)
    for cell in chosen:
        assert cell.id.endswith(f"-fix_{cell.fixes}")
        assert cell_environment(cell, None)["DISTCI_FIXES"] == ("all" if cell.fixes == "on" else "none")


@pytest.mark.parametrize("value", ["nonexistent", "act_tangent_coercion", "all,none"])
def test_distci_fixes_ids_are_refused_by_a_cell_run(value):
    from distci.errors import ConfigError
    from distci.matrix import load_matrix
    from distci.run.fixesmode import fixes_override

    cells = load_matrix(REPO / "matrix.toml").cells[:1]
    with pytest.raises(ConfigError, match=rf"DISTCI_FIXES: '{value}': a cell run takes `all` or `none`"):
        fixes_override(cells, {"DISTCI_FIXES": value})


@pytest.mark.slow  # a pytest child process: ~20 s on a loaded 2-core machine
def test_the_harness_lives_in_config_stash(tmp_path):
    """Plugin state in config.stash (pytest's own plugins' way), not an attribute of config."""
    (tmp_path / "test_stash.py").write_text(
        "from distci.harness.plugin import HARNESS, harness_of\n"
        "def test_stash(request):\n"
        "    assert harness_of(request.config) is request.config.stash[HARNESS]\n"
        "    assert harness_of(request.config).device_type == 'cpu'\n"
        "    assert not hasattr(request.config, '_distci')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-q",
                           "--distci-device=cpu", str(tmp_path / "test_stash.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]


@pytest.mark.parametrize("state, message", [
    (RankState(1, exit_code=-11), "rank 1 killed by SIGSEGV"),
    (RankState(1, exit_code=None, channel="EOFError on the socket"),
     "rank 1 lost its control channel to the controller (EOFError on the socket) while its process was still running"),
    (RankState(1, exit_code=75, channel="EOFError on the socket"),
     "rank 1 lost its control channel to the controller (EOFError on the socket) and the rank exited"),
])
def test_a_lost_rank_is_named_by_what_happened_never_a_made_up_signal(state, message):
    combined = combine([RankState(0), state], 1.0)
    assert (combined.outcome, combined.failure_kind, combined.message) == ("failed", "crash", message)
    assert combined.needs_rebuild and "SIGHUP" not in combined.render()


@pytest.mark.parametrize("peer", [RankState(0, exit_code=70), RankState(0, exit_code=-9), RankState(0, exit_code=1)])
def test_of_ranks_that_died_the_one_that_faulted_is_named_whatever_its_rank(peer):
    """A finished rank leaves once its peer is gone: the segfault is the cause, in any rank order."""
    combined = combine([peer, RankState(1, exit_code=-11)], 1.0)
    assert combined.message == "rank 1 killed by SIGSEGV (ranks 0, 1 died)"
    assert combine([RankState(0, exit_code=70), RankState(1, exit_code=3)], 1.0).message.startswith("rank 0 ")
