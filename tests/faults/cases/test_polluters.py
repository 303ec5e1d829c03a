"""Fault cases: passing tests that leave their rank process changed in ways no list in distci
names, each followed by an innocent test that must pass and leave whole evidence.

`test_kind[<kind>-pollute]` changes one thing about its process and passes;
`test_kind[<kind>-check]`, the next test, asserts the process is as a fresh one is (each
check is proven able to fail by the `--distci-no-isolation` run in tests/test_faults_polluters.py)
and writes its marker to stdout, stderr and logging, which the driver looks for in the
rank logs. The witnesses at the end (a hang, a crash) must still leave their stacks.

    python -m pytest -p distci.harness.plugin tests/faults/cases/test_polluters.py --distci-device=cuda --distci-timeout=12

What the pollute phase saw before its change reaches the check through faults_memo.py.
"""

import atexit
import faulthandler
import gc
import json
import logging
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from faults_memo import recall, remember


def _torch():
    import torch

    return torch


_kept: list = []  # contexts entered and never left, kept alive on purpose


# -- each kind: (what to remember before, change, check(remembered)) ---------------------
def _patch_tensor_method():
    torch = _torch()
    torch.Tensor.add = lambda self, other, **kw: torch.zeros_like(self)


def _check_tensor_method(_):
    torch = _torch()
    assert torch.ones(3).add(torch.ones(3)).tolist() == [2.0, 2.0, 2.0], "torch.Tensor.add is patched"


def _enter_zeroing_dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    torch = _torch()

    class ZeroMM(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return out * 0 if func is torch.ops.aten.mm.default else out

    mode = ZeroMM()
    mode.__enter__()
    _kept.append(mode)


def _check_mm(_):
    torch = _torch()
    a = torch.arange(4.0).reshape(2, 2)
    assert torch.mm(a, a).tolist() == [[2.0, 3.0], [6.0, 11.0]], "matmul gives wrong numbers"


def _enter_zeroing_saved_tensor_hooks():
    torch = _torch()
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: torch.zeros_like(t))
    hooks.__enter__()
    _kept.append(hooks)


def _check_autograd(_):
    torch = _torch()
    x = torch.tensor([3.0], requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.tolist() == [6.0], f"autograd gives {x.grad.tolist()} for d(x*x)/dx at 3"


def _check_recursion(before):
    assert sys.getrecursionlimit() == before, f"recursion limit {sys.getrecursionlimit()} (a fresh process: {before})"

    def down(n):
        return 0 if n == 0 else 1 + down(n - 1)

    assert down(300) == 300


def _register_atexit():
    atexit.register(os.kill, os.getppid(), signal.SIGKILL)  # would kill the rank's worker at exit


def _atexit_count():
    return atexit._ncallbacks()


def _swallow_stdout():
    import io

    sys.stdout = sys.stderr = io.StringIO()


def _redirect_fds():
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)


def _mute_print():
    import builtins

    builtins.print = lambda *a, **k: None


def _silence_logging():
    logging.disable(logging.CRITICAL)
    logging.getLogger().handlers[:] = [logging.NullHandler()]


def _fake_json_module():
    import types

    sys.modules["json"] = types.SimpleNamespace(dumps=lambda *a, **k: "{}")


def _check_json(_):
    import json as json_now

    assert json_now.dumps([1]) == "[1]" and json_now is json, "sys.modules['json'] is not the json module"


def _flush_denormal():
    assert _torch().set_flush_denormal(True), "this CPU cannot flush denormals"


def _check_denormal(_):
    torch = _torch()
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    assert (tiny * 1.0).item() != 0.0, "denormals are flushed to zero"


def _mkldnn_off():
    _torch()._C._set_mkldnn_enabled(False)


def _arm_alarm():
    def boom(*_):
        raise RuntimeError("an alarm a previous test set went off")

    signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, 2.0)


def _check_alarm(_):
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0), "an interval timer is armed"
    time.sleep(2.5)  # it would go off here


def _ld_preload():
    os.environ["LD_PRELOAD"] = "/nonexistent/distci-libpolluted.so"


def _check_subprocess(before):
    assert os.environ.get("LD_PRELOAD") == before, f"LD_PRELOAD is {os.environ.get('LD_PRELOAD')!r}"
    out = subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True, text=True, timeout=60)
    assert out.stdout == "ok\n" and "LD_PRELOAD" not in out.stderr, out.stderr


def _patch_random():
    random.shuffle = lambda seq, *a: None


def _check_shuffle(_):
    deck = list(range(100))
    random.shuffle(deck)
    assert deck != list(range(100)), "random.shuffle leaves lists as they are"


def _stray_thread():
    torch = _torch()
    junk = torch.zeros(1)

    def loop():
        while True:
            junk.add_(1)
            time.sleep(0.01)

    threading.Thread(target=loop, name="distci-polluter-thread", daemon=True).start()


def _check_threads(before):
    names = [t.name for t in threading.enumerate()]
    assert "distci-polluter-thread" not in names, f"a previous test's thread still runs: {names}"


def _trace_everything():
    sys.settrace(lambda *a: None)
    threading.settrace(lambda *a: None)


def _lower_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))


def _check_nofile(before):
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == before, resource.getrlimit(resource.RLIMIT_NOFILE)
    files = [tempfile.TemporaryFile() for _ in range(100)]
    for fh in files:
        fh.close()


def _check_umask(before):
    now = os.umask(before)
    os.umask(now)
    assert now == before, f"umask {now:o} (a fresh process: {before:o})"


def _check_signal(before):
    assert signal.getsignal(signal.SIGTERM) == before, f"SIGTERM's handler is {signal.getsignal(signal.SIGTERM)}"


def _destroy_group():
    import torch.distributed as d

    d.destroy_process_group()


def _umask():
    os.umask(0o777)


def _same(name):
    def check(before, _get=KINDS_GET.get(name)):
        assert _get() == before, f"{name}: {_get()!r} (a fresh process: {before!r})"
    return check


KINDS_GET = {
    "gc_disabled": gc.isenabled,
    "faulthandler_disabled": faulthandler.is_enabled,
    "mkldnn_off": lambda: _torch()._C._get_mkldnn_enabled(),
    "settrace": sys.gettrace,
    "atexit_hook": _atexit_count,
    "stdout_replaced": lambda: (sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__),
    "print_muted": lambda: __import__("builtins").print is _REAL_PRINT,
    "logging_silenced": lambda: (logging.root.manager.disable, [type(h).__name__ for h in logging.getLogger().handlers]),
}
_REAL_PRINT = print

# name -> (take: what a fresh process has, change, check(taken))
KINDS = {
    "tensor_method": (lambda: None, _patch_tensor_method, _check_tensor_method),
    "dispatch_mode": (lambda: None, _enter_zeroing_dispatch_mode, _check_mm),
    "saved_tensor_hooks": (lambda: None, _enter_zeroing_saved_tensor_hooks, _check_autograd),
    "recursion_limit": (sys.getrecursionlimit, lambda: sys.setrecursionlimit(250), _check_recursion),
    "atexit_hook": (_atexit_count, _register_atexit, _same("atexit_hook")),
    "stdout_replaced": (KINDS_GET["stdout_replaced"], _swallow_stdout, _same("stdout_replaced")),
    "print_muted": (KINDS_GET["print_muted"], _mute_print, _same("print_muted")),
    "logging_silenced": (KINDS_GET["logging_silenced"], _silence_logging, _same("logging_silenced")),
    "gc_disabled": (gc.isenabled, gc.disable, _same("gc_disabled")),
    "flush_denormal": (lambda: None, _flush_denormal, _check_denormal),
    "mkldnn_off": (KINDS_GET["mkldnn_off"], _mkldnn_off, _same("mkldnn_off")),
    "umask": (lambda: os.umask(os.umask(0o022)), _umask, _check_umask),
    "ld_preload": (lambda: os.environ.get("LD_PRELOAD"), _ld_preload, _check_subprocess),
    "random_patched": (lambda: None, _patch_random, _check_shuffle),
    "stray_thread": (lambda: None, _stray_thread, _check_threads),
    "settrace": (sys.gettrace, _trace_everything, _same("settrace")),
    "nofile_rlimit": (lambda: resource.getrlimit(resource.RLIMIT_NOFILE), _lower_nofile, _check_nofile),
    "sigterm_ignored": (lambda: signal.getsignal(signal.SIGTERM), lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
                        _check_signal),
    "faulthandler_disabled": (faulthandler.is_enabled, faulthandler.disable, _same("faulthandler_disabled")),
    "alarm_armed": (lambda: None, _arm_alarm, _check_alarm),
    "json_module_faked": (lambda: None, _fake_json_module, _check_json),
    "fds_redirected": (lambda: None, _redirect_fds, lambda _: None),  # the driver finds the markers, or not
    "group_destroyed": (lambda: None, _destroy_group, lambda _: None),  # the check's all-reduce judges it
}


def _innocent_evidence(kind: str, dist) -> None:
    """What the driver looks for in the rank log: the check ran, and its output arrived."""
    import torch
    import torch.distributed as d

    t = torch.ones(2, device=dist.device) * (dist.rank + 1)
    d.all_reduce(t)
    expected = dist.world_size * (dist.world_size + 1) / 2
    assert t.tolist() == [expected, expected], f"rank {dist.rank}: all_reduce gave {t.tolist()}"
    print(f"innocent {kind} stdout rank{dist.rank}", flush=True)
    print(f"innocent {kind} stderr rank{dist.rank}", file=sys.stderr, flush=True)
    logging.getLogger("distci.polluters").warning("innocent %s logging rank%d", kind, dist.rank)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("kind,phase", [(kind, phase) for kind in KINDS for phase in ("pollute", "check")])
def test_kind(dist, kind, phase):
    take, change, check = KINDS[kind]
    if phase == "pollute":
        remember(kind, dist.rank, take())
        change()
        return
    check(recall(kind, dist.rank))
    _innocent_evidence(kind, dist)


# -- witnesses: after every polluter, the harness still sees a hang's and a crash's cause ---
@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(5)
def test_witness_hang(dist):
    import torch
    import torch.distributed as d

    if dist.rank == 0:
        d.all_reduce(torch.ones(1, device=dist.device))  # rank 1 never joins
    else:
        time.sleep(60)


@pytest.mark.world_size(2)
def test_witness_crash(dist):
    import ctypes

    if dist.rank == 1:
        ctypes.string_at(0)
