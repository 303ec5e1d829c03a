"""Fault cases: a test changes its rank process where no isolation list looks, or fails in a
way that is easy to mis-attribute. Each `test_X` is followed by `test_after_X`, which must
pass (the state is as it was, the pool answers a known all-reduce) whatever X did.

Run by tests/test_faults_state.py (CPU, gloo); device-agnostic, as test_pool_faults.py:

    python -m pytest -p distci.harness.plugin tests/faults/cases/test_state_faults.py --distci-device=cuda --distci-timeout=12
"""

import logging
import os
import signal
import socket
import sys
import threading
import time
import types

import pytest
from faults_memo import recall, remember

_kept: list = []  # objects kept alive on purpose (a mode entered and never left)


def _check_allreduce(dist):
    import torch
    import torch.distributed as d

    t = torch.ones(2, device=dist.device) * (dist.rank + 1)
    d.all_reduce(t)
    expected = dist.world_size * (dist.world_size + 1) / 2
    assert t.tolist() == [expected, expected], f"rank {dist.rank} got {t.tolist()}"


# -- global module hooks ----------------------------------------------------------------
def _double_output(_module, _args, output):
    return output * 2


@pytest.mark.world_size(2)
def test_leaves_forward_hook(dist):
    from torch.nn.modules.module import register_module_forward_hook

    register_module_forward_hook(_double_output)


@pytest.mark.world_size(2)
def test_after_leaves_forward_hook(dist):
    import torch

    lin = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3)
    torch.testing.assert_close(lin(x), x @ lin.weight.T + lin.bias)
    _check_allreduce(dist)


# -- a torch function mode never exited -------------------------------------------------
@pytest.mark.world_size(2)
def test_leaves_function_mode(dist):
    import torch
    from torch.overrides import TorchFunctionMode

    class ZeroAdds(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return out * 0 if func is torch.add else out

    mode = ZeroAdds()
    mode.__enter__()
    _kept.append(mode)


@pytest.mark.world_size(2)
def test_after_leaves_function_mode(dist):
    import torch

    assert torch.add(torch.ones(1), 1).item() == 2.0
    _check_allreduce(dist)


# -- monkeypatched torch, torch.nn.functional, torch.Tensor ------------------------------
@pytest.mark.world_size(2)
def test_patches_torch(dist):
    import torch
    import torch.nn.functional as F

    remember("gelu", dist.rank, F.gelu(torch.ones(1)).item())
    F.gelu = lambda x, approximate="none": x * 0
    torch.tanh = lambda x: x * 0
    torch.Tensor.relu = lambda self: self * 0


@pytest.mark.world_size(2)
def test_after_patches_torch(dist):
    import torch
    import torch.nn.functional as F

    assert F.gelu(torch.ones(1)).item() == recall("gelu", dist.rank)
    assert torch.tanh(torch.ones(1)).item() > 0.7
    assert torch.ones(1).relu().item() == 1.0
    _check_allreduce(dist)


# -- class state and collectives: DDP's active module, a patched all_reduce --------------
@pytest.mark.world_size(2)
def test_leaves_ddp_state_and_patches_a_collective(dist):
    import torch.distributed as d
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel._active_ddp_module = object()  # what a failed compiled DDP forward leaves
    d.all_reduce = lambda tensor, *args, **kwargs: None


@pytest.mark.world_size(2)
def test_after_leaves_ddp_state_and_patches_a_collective(dist):
    import torch.distributed as d
    from torch.nn.parallel import DistributedDataParallel

    assert DistributedDataParallel._active_ddp_module is None
    assert d.all_reduce is d.distributed_c10d.all_reduce
    _check_allreduce(dist)


# -- sys.path and sys.modules ----------------------------------------------------------
@pytest.mark.world_size(2)
def test_leaves_sys_path_and_modules(dist):
    sys.path.insert(0, "/nonexistent/distci-leaked-path")
    sys.modules["distci_fault_fake"] = types.ModuleType("distci_fault_fake")
    sys.modules["colorsys"] = types.SimpleNamespace(rgb_to_hsv=None)


@pytest.mark.world_size(2)
def test_after_leaves_sys_path_and_modules(dist):
    import colorsys as now

    assert "/nonexistent/distci-leaked-path" not in sys.path
    assert "distci_fault_fake" not in sys.modules
    assert isinstance(now, types.ModuleType) and now.rgb_to_hsv(1, 0, 0)[2] == 1
    _check_allreduce(dist)


# -- root logger, anomaly mode ----------------------------------------------------------
@pytest.mark.world_size(2)
def test_leaves_root_logger_and_anomaly_mode(dist):
    import torch

    root = logging.getLogger()
    remember("logger", dist.rank, (root.level, [type(h).__name__ for h in root.handlers]))
    root.addHandler(logging.StreamHandler())
    root.setLevel(logging.DEBUG)
    remember("anomaly", dist.rank, torch.is_anomaly_enabled())
    torch.autograd.set_detect_anomaly(True)


@pytest.mark.world_size(2)
def test_after_leaves_root_logger_and_anomaly_mode(dist):
    import torch

    root = logging.getLogger()
    assert (root.level, [type(h).__name__ for h in root.handlers]) == recall("logger", dist.rank)
    assert torch.is_anomaly_enabled() == recall("anomaly", dist.rank) is False
    _check_allreduce(dist)


# -- the hang detector's own signal ----------------------------------------------------
@pytest.mark.world_size(2)
def test_ignores_sigusr1(dist):
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(6)
def test_hangs_after_sigusr1_ignored(dist):
    """A real hang after the previous test ignored SIGUSR1: still `hang`, with rank 0's stack."""
    import torch
    import torch.distributed as d

    if dist.rank == 0:
        t = torch.ones(1, device=dist.device)
        d.all_reduce(t)
        t.item()


@pytest.mark.world_size(2)
def test_after_hangs_after_sigusr1_ignored(dist):
    _check_allreduce(dist)


# -- threads left running ---------------------------------------------------------------
def _all_reduce_forever(device):
    import torch
    import torch.distributed as d

    while True:
        d.all_reduce(torch.full((2,), 16.0, device=device))


@pytest.mark.world_size(2)
def test_leaves_collective_thread(dist):
    threading.Thread(target=_all_reduce_forever, args=(dist.device,), name="stray-allreduce", daemon=True).start()
    time.sleep(0.5)


@pytest.mark.world_size(2)
def test_after_leaves_collective_thread(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
def test_leaves_nondaemon_thread(dist):
    threading.Thread(target=time.sleep, args=(3600,), name="stray-sleeper").start()


@pytest.mark.world_size(2)
def test_after_leaves_nondaemon_thread(dist):
    _check_allreduce(dist)


# -- attribution: what a test raises is that test's failure ------------------------------
class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text for you")


@pytest.mark.world_size(2)
def test_raises_unprintable(dist):
    if dist.rank == 1:
        raise Unprintable()


@pytest.mark.world_size(2)
def test_after_raises_unprintable(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_raises_base_exception(dist, exc):
    if dist.rank == 1:
        raise exc()


@pytest.mark.world_size(2)
def test_after_raises_base_exception(dist):
    _check_allreduce(dist)


@pytest.mark.world_size(2)
def test_breaks_control_channel(dist):
    """Rank 1 shuts its socket to the controller down: no signal is sent to anyone."""
    if dist.rank == 1:
        fd = int(sys.argv[sys.argv.index("--fd") + 1])
        sock = socket.socket(fileno=os.dup(fd))
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()


@pytest.mark.world_size(2)
def test_after_breaks_control_channel(dist):
    _check_allreduce(dist)


# -- scratch: two sessions in one checkout ----------------------------------------------
@pytest.mark.world_size(2)
def test_logs_its_mark_and_fails(dist):
    """Prints this session's mark (DISTCI_FAULT_MARK) for a while, then fails on rank 0: its
    excerpt must hold only this session's lines."""
    mark = os.environ.get("DISTCI_FAULT_MARK", "mark")
    for i in range(40):
        print(f"{mark} line {i}", flush=True)
        time.sleep(0.05)
    assert dist.rank != 0, f"{mark} fails on rank 0"
