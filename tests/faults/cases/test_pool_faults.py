"""Fault cases: tests that break the harness's assumptions, each followed by a healthy one.

Run by tests/test_faults.py (CPU, gloo) and unchanged on any accelerator:

    python -m pytest -p distci.harness.plugin tests/faults/cases --distci-device=cuda --distci-timeout=12

Device-agnostic: tensors live on `dist.device`; nothing names a backend. Every fault
case `test_X` is followed by `test_after_X`, which must pass whatever X did.
"""

import os
import time
import warnings

import pytest
from faults_compute import compute_until
from faults_memo import recall, remember


def _check_allreduce(dist):
    """The known-answer all-reduce every `after` case runs: a stale collective would change it."""
    import torch
    import torch.distributed as d

    t = torch.ones(2, device=dist.device) * (dist.rank + 1)
    d.all_reduce(t)
    expected = dist.world_size * (dist.world_size + 1) / 2
    assert t.tolist() == [expected, expected], f"rank {dist.rank} got {t.tolist()}"


# -- a poisoned pool, two ways -------------------------------------------------------
@pytest.mark.world_size(2)
def test_destroys_group(dist):
    import torch.distributed as d

    _check_allreduce(dist)
    d.destroy_process_group()


@pytest.mark.world_size(2)
def test_after_destroys_group(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
def test_unwaited_collective(dist):
    import torch
    import torch.distributed as d

    if dist.rank == 0:
        d.all_reduce(torch.full((2,), 100.0, device=dist.device), async_op=True)  # never waited


@pytest.mark.world_size(2)
def test_after_unwaited_collective(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
def test_leaves_fake_mode(dist):
    from torch._subclasses.fake_tensor import FakeTensorMode

    FakeTensorMode().__enter__()  # never exited, as after an exception inside AOTAutograd's tracing


@pytest.mark.world_size(2)
def test_after_leaves_fake_mode(dist):
    _check_allreduce(dist)


# -- process-group timeout follows the marker -----------------------------------------
@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(40)
def test_long_marker(dist):
    """Rank 0 waits 12 s in a collective: longer than the default class's process-group
    timeout of a --distci-timeout=12 run (9 s), well inside this test's 40 s."""
    if dist.rank == 1:
        time.sleep(12)
    _check_allreduce(dist)


@pytest.mark.world_size(2)
def test_after_long_marker(dist):
    _check_allreduce(dist)


# -- classification by frames, not by names ----------------------------------------------
@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(4)
def test_broadcast_spin(dist):
    """Pure-Python compute in a test whose name says "broadcast": slow, not hung."""
    compute_until(time.monotonic() + 3600)


@pytest.mark.world_size(2)
def test_after_broadcast_spin(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(6)
def test_skipped_collective(dist):
    """The classic bug: rank 1 skips a collective rank 0 enters. Also run in torchrun mode."""
    import torch
    import torch.distributed as d

    if dist.rank == 0:
        t = torch.ones(1, device=dist.device)
        d.all_reduce(t)
        t.item()


@pytest.mark.world_size(2)
def test_after_skipped_collective(dist):
    _check_allreduce(dist)


# -- a crash leaves its Python stack --------------------------------------------------------
def _crash_here():
    import ctypes

    ctypes.string_at(0)


@pytest.mark.world_size(2)
def test_segfault(dist):
    if dist.rank == 1:
        _crash_here()


@pytest.mark.world_size(2)
def test_after_segfault(dist):
    _check_allreduce(dist)


# -- leaked globals: each `test_leak_X` changes X, `test_sees_X` (next) must not see it ----


def _torch():
    import torch

    return torch


_kept: list = []  # context managers entered and never left, kept alive on purpose


def _enter_inference_mode(_dt):
    cm = _torch().inference_mode()
    cm.__enter__()
    _kept.append(cm)


def _other_precision(_dt):
    torch = _torch()
    torch.set_float32_matmul_precision("medium" if torch.get_float32_matmul_precision() != "medium" else "high")


# name -> (get(device_type), change(device_type))
LEAKS = {
    "default_dtype": (lambda dt: _torch().get_default_dtype(), lambda dt: _torch().set_default_dtype(_torch().float64)),
    "default_device": (lambda dt: _torch().empty(1).device.type, lambda dt: _torch().set_default_device("meta")),
    "num_threads": (lambda dt: _torch().get_num_threads(),
                    lambda dt: _torch().set_num_threads(_torch().get_num_threads() + 2)),
    "deterministic": (lambda dt: _torch().are_deterministic_algorithms_enabled(),
                      lambda dt: _torch().use_deterministic_algorithms(True)),
    "grad_mode": (lambda dt: _torch().is_grad_enabled(), lambda dt: _torch().set_grad_enabled(False)),
    "inference_mode": (lambda dt: _torch().is_inference_mode_enabled(), _enter_inference_mode),
    "autocast": (lambda dt: _torch().is_autocast_enabled(dt), lambda dt: _torch().set_autocast_enabled(dt, True)),
    "matmul_precision": (lambda dt: _torch().get_float32_matmul_precision(), _other_precision),
    "environ": (lambda dt: os.environ.get("DISTCI_LEAKED_VAR"),
                lambda dt: os.environ.__setitem__("DISTCI_LEAKED_VAR", "1")),
    "cwd": (lambda dt: os.getcwd(), lambda dt: os.chdir(os.path.dirname(os.getcwd()) or os.sep)),
    "warnings_filters": (lambda dt: list(warnings.filters), lambda dt: warnings.simplefilter("error", ResourceWarning)),
}


@pytest.mark.world_size(2)
@pytest.mark.parametrize("name,phase", [(name, phase) for name in LEAKS for phase in ("leak", "sees")])
def test_global(dist, name, phase):
    """`leak` changes one process-wide setting; `sees`, the next test, must find it as it was."""
    get, change = LEAKS[name]
    dt = dist.device.type
    if phase == "leak":
        before = get(dt)
        remember(name, dist.rank, before)
        change(dt)
        assert get(dt) != before, f"the case did not change {name}"
    else:
        before = recall(name, dist.rank)
        assert get(dt) == before, f"{name} leaked from the previous test: {get(dt)!r} != {before!r}"
