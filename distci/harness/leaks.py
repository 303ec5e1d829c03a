"""Isolation by detection: what a test changed in its rank process that no list restores.

isolation.py sets back, by name, the settings every test may legitimately change (default
dtype, grad mode, ...). A test can also change the process for every later test where no
setting is: a global module hook, a torch function mode left on its stack, a patched
`torch.nn.functional.gelu`, a fake entry in `sys.modules`, a root-logger handler, anomaly
mode, a signal disposition, a thread still issuing collectives. `snapshot()` records those
places just before the test body runs (after its module is imported: what an import does
once is no test's fault); `check()` compares after it, sets back what it can and returns
one Leak per change. The controller fails the test that leaked (never the next one) and
rebuilds the pool where a change cannot be undone in place (a mode, a running thread).

The snapshot is cheap on purpose (shallow copies of a few dicts and lists, about a
millisecond with torch, compile and distributed imported): it runs around every test.
Each probe that reads an API this torch lacks is left out, never an error.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import sysconfig
import threading
import time
import types
from dataclasses import asdict, dataclass
from typing import Any, Callable

THREAD_GRACE_S = 0.5  # a thread the test started may finish on its own within this
_COLLECTIVE_FILE = ("/torch/distributed/", "/torch_npu/distributed/")
_MODULE_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                 "_global_backward_hooks", "_global_forward_hooks_with_kwargs",
                 "_global_forward_hooks_always_called", "_global_module_registration_hooks",
                 "_global_parameter_registration_hooks", "_global_buffer_registration_hooks")


@dataclass
class Leak:
    """One change a test left behind; `restored` False: only a new process undoes it."""

    what: str
    restored: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _name(obj: Any) -> str:
    mod = getattr(obj, "__module__", None) or ""
    qual = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{mod}.{qual}" if mod and mod != "builtins" else qual


# -- probes: (name, take() -> state, check(state) -> leaks, restoring what it can) -----------
def _module_hooks_take() -> dict[str, dict]:
    from torch.nn.modules import module

    return {n: dict(getattr(module, n)) for n in _MODULE_HOOKS if hasattr(module, n)}


def _module_hooks_check(before: dict[str, dict]) -> list[Leak]:
    from torch.nn.modules import module

    leaks = []
    for name, saved in before.items():
        now = getattr(module, name)
        added = [k for k in now if k not in saved]
        if now.keys() == saved.keys():
            continue
        if "_with_kwargs" not in name and "_always_called" not in name:
            kind = name.removeprefix("_global_").removesuffix("s").replace("_", " ")
            for key in added:
                leaks.append(Leak(f"a global module {kind} ({_name(now[key])}) still registered", True))
            if len(now) < len(saved):
                leaks.append(Leak(f"global module {kind}s removed", True))
        now.clear()
        now.update(saved)
    return leaks


def _function_modes_take() -> list:
    import torch

    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def _function_modes_check(before: list) -> list[Leak]:
    now = _function_modes_take()
    if len(now) == len(before) and all(a is b for a, b in zip(now, before)):
        return []
    extra = [type(m).__name__ for m in now if not any(m is b for b in before)]
    return [Leak(f"a torch function mode still active ({', '.join(extra) or 'the mode stack changed'})", False)]


_PATCH_TARGETS = (
    ("torch", None, "all"), ("torch.nn.functional", None, "all"), ("torch.Tensor", None, "all"),
    ("torch.nn.parallel", "DistributedDataParallel", "all"),
    ("torch.distributed.tensor", "DTensor", "all"),
    ("torch.distributed", None, "callables"), ("torch.distributed.distributed_c10d", None, "callables"),
)
"""Where tests (and bugs) patch torch: its namespaces, the tensor and module classes, DDP's
class state (a failed compiled forward leaves `_active_ddp_module` set, and every later
compile in the process then runs DDPOptimizer for it), DTensor, and the collectives. In the
c10d modules only callables are judged: their data globals are the process groups' own state
(new_group reassigns `_group_count`). Not torch.nn.Module: Dynamo's first compile patches its
__init__ and __setstate__ for good (mutation_guard). Owners this torch lacks are left out."""


def _owners() -> dict[str, tuple[Any, str]]:
    """{name: (owner, scope)} of the _PATCH_TARGETS this torch has."""
    import importlib

    owners = {}
    for where, attr, scope in _PATCH_TARGETS:
        try:
            owner = importlib.import_module(where)
        except ImportError:
            if "." not in where:
                raise
            parent, _, name = where.rpartition(".")  # a class: torch.Tensor, torch.nn.Module
            try:
                owner = getattr(importlib.import_module(parent), name)
            except (ImportError, AttributeError):
                continue
        if attr is not None:
            owner = getattr(owner, attr, None)
            if owner is None:
                continue
            where = f"{where}.{attr}"
        owners[where] = (owner, scope)
    return owners


def _attributes_take() -> dict[str, dict[str, Any]]:
    return {where: dict(vars(owner)) for where, (owner, _) in _owners().items()}


def _legitimate(value: Any, key: str = "") -> bool:
    """A change no test is to blame for: a submodule imported lazily, a fix armed on import,
    copyreg's cache of a class's slot names (the first pickle of a tensor)."""
    if key == "__slotnames__" or isinstance(value, types.ModuleType):
        return True
    return (getattr(value, "__module__", None) or "").startswith("distci_fixes")


def _attributes_check(before: dict[str, dict[str, Any]]) -> list[Leak]:
    owners = _owners()
    leaks = []
    for where, saved in before.items():
        owner, scope = owners[where]
        now = vars(owner)
        judged = (lambda v: True) if scope == "all" else callable
        for key in [k for k in now if k not in saved]:
            if judged(now[key]) and not _legitimate(now[key], key):
                leaks.append(Leak(f"{where}.{key} added ({_name(now[key])})", True))
                delattr(owner, key)
        for key, value in saved.items():
            if not (judged(value) or judged(now.get(key))):
                continue
            if key not in now:
                leaks.append(Leak(f"{where}.{key} deleted", True))
                setattr(owner, key, value)
            elif now[key] is not value and not _legitimate(now[key]):
                leaks.append(Leak(f"{where}.{key} replaced (by {_name(now[key])})", True))
                setattr(owner, key, value)
    return leaks


def _installed(path: str, before: list[str] = ()) -> bool:
    """Inside the interpreter's library dirs: what an installed package adds on import
    (setuptools puts its `_vendor` dir on sys.path when torch's C++ builder imports it).
    Those are the interpreter's own and every site-packages dir already on sys.path: an
    overlay env over a preinstalled stack (`--python`) sees the stack's through a .pth."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {p for p in before if p.rstrip("/").endswith(("/site-packages", "/dist-packages"))}
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _sys_path_check(before: list[str]) -> list[Leak]:
    if sys.path == before:
        return []
    kept = [p for p in sys.path if p not in before and _installed(p, before)]
    added = [p for p in sys.path if p not in before and p not in kept]
    removed = [p for p in before if p not in sys.path]
    if not added and not removed and sys.path[:len(before)] == before:
        return []
    what = "; ".join(filter(None, [f"added {added}" if added else "", f"removed {removed}" if removed else ""]))
    sys.path[:] = before + kept
    return [Leak(f"sys.path changed ({what or 'reordered'})", True)]


def _by_hand(module: Any) -> bool:
    """An entry no import made: not a module, or a module with neither spec nor file."""
    if not isinstance(module, types.ModuleType):
        return True
    return getattr(module, "__spec__", None) is None and getattr(module, "__file__", None) is None


_CYTHON_ABI_MODULE = re.compile(r"_cython_\d+_\d+(_\d+)*")
"""Cython's shared-types module (`_cython_3_3_0`): every Cython-compiled extension's import
creates it with PyModule_New (no spec, no file) the first time, mid-test if a test is the
first to import one."""


def _set_by_a_new_import(value: Any, before: dict[str, Any], name: str = "") -> bool:
    """An entry a package sets while it is first imported, with an object of its own class:
    Cython's `Cython.Shadow` puts `cython.parallel` / `cython.cimports` stand-ins into
    sys.modules the first time anything imports it (torch's C++ builder may, mid-test).
    The class's module is new since the snapshot, so no test file defined it: a test's own
    fake comes from the test module (imported before the snapshot) or is a bare
    `types.ModuleType`, and stays a leak."""
    if isinstance(value, types.ModuleType) and _CYTHON_ABI_MODULE.fullmatch(name):
        return True
    owner = getattr(type(value), "__module__", None) or ""
    return owner not in ("", "builtins", "types") and owner not in before and owner in sys.modules


def _sys_modules_check(before: dict[str, Any]) -> list[Leak]:
    """Entries set by hand (a fake module, a stand-in object), new or in place of a real
    module. An import's own changes are not leaks: Inductor re-imports its generated
    modules under the same name and drops entries to reload them, every test; a package
    imported for the first time may set stand-ins of its own classes (`_set_by_a_new_import`)."""
    leaks = []
    now = sys.modules
    for name in [n for n in now if now[n] is not before.get(n) and _by_hand(now[n])
                 and not _set_by_a_new_import(now[n], before, n)]:
        value = now[name]
        what = "a module no import made" if isinstance(value, types.ModuleType) else _name(value)
        if name in before:
            leaks.append(Leak(f"sys.modules[{name!r}] replaced by hand ({what})", True))
            now[name] = before[name]
        else:
            leaks.append(Leak(f"sys.modules[{name!r}] set by hand ({what})", True))
            del now[name]
    return leaks


def _root_logger_take() -> tuple[int, list, int]:
    root = logging.getLogger()
    return root.level, list(root.handlers), logging.root.manager.disable


def _root_logger_check(before: tuple[int, list, int]) -> list[Leak]:
    level, handlers, disable = before
    root = logging.getLogger()
    leaks = []
    if root.handlers != handlers:
        added = [type(h).__name__ for h in root.handlers if h not in handlers]
        leaks.append(Leak(f"root logger handlers changed ({'added ' + ', '.join(added) if added else 'removed'})", True))
        root.handlers[:] = handlers
    if root.level != level:
        leaks.append(Leak(f"root logger level changed ({logging.getLevelName(level)} -> "
                          f"{logging.getLevelName(root.level)})", True))
        root.setLevel(level)
    if logging.root.manager.disable != disable:
        leaks.append(Leak(f"logging.disable({logging.root.manager.disable}) left on", True))
        logging.disable(disable)
    return leaks


def _anomaly_take() -> tuple[bool, bool]:
    import torch

    return torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()


def _anomaly_check(before: tuple[bool, bool]) -> list[Leak]:
    import torch

    now = _anomaly_take()
    if now == before:
        return []
    torch.set_anomaly_enabled(*before)
    return [Leak(f"autograd anomaly detection left {'on' if now[0] else 'off'} (check_nan={now[1]})", True)]


_SIGNALS = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))


def _signals_take() -> dict[int, Any]:
    return {s: signal.getsignal(s) for s in _SIGNALS}


def _disposition(handler: Any) -> str:
    if handler in (signal.SIG_IGN, signal.SIG_DFL):
        return signal.Handlers(handler).name
    return _name(handler) if handler is not None else "a handler set outside Python"


def _signals_check(before: dict[int, Any]) -> list[Leak]:
    leaks = []
    for sig, handler in before.items():
        now = signal.getsignal(sig)
        if now is handler or now == handler:
            continue
        name = signal.Signals(sig).name
        leaks.append(Leak(f"the disposition of {name} changed (to {_disposition(now)})", handler is not None))
        if handler is not None:
            signal.signal(sig, handler)
    return leaks


def _frames(thread: threading.Thread) -> list[tuple[str, int, str]]:
    frame = sys._current_frames().get(thread.ident or -1)
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename.replace("\\", "/"), frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out  # innermost first


def thread_leak(thread: threading.Thread, test_file: str) -> Leak | None:
    """A thread the test left running, when it still matters: it runs the test's own code or
    torch.distributed code (a collective from it would land in the next test), or it is a
    non-daemon thread that is not an idle executor worker (it would also block the rank's exit)."""
    frames = _frames(thread)
    in_test = any(f == test_file for f, _, _ in frames)
    collective = next(((f, n, fn) for f, n, fn in frames if any(c in f for c in _COLLECTIVE_FILE)), None)
    executor = any(f.endswith("concurrent/futures/thread.py") and fn == "_worker" for f, _, fn in frames)
    if not (in_test or collective or (not thread.daemon and not executor)):
        return None
    where = collective or next(((f, n, fn) for f, n, fn in frames if f == test_file), frames[0] if frames else None)
    at = f" at {where[0].rsplit('/', 1)[-1]}:{where[1]} in {where[2]}" if where else ""
    doing = ", inside torch.distributed" if collective else ""
    kind = "daemon" if thread.daemon else "non-daemon"
    return Leak(f"a {kind} thread still running ({thread.name!r}{at}{doing})", False)


def _threads_check(before: set[threading.Thread], test_file: str) -> list[Leak]:
    new = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    deadline = time.monotonic() + THREAD_GRACE_S
    for t in new:
        t.join(max(0.0, deadline - time.monotonic()))
    found = (thread_leak(t, test_file) for t in new if t.is_alive())
    return [leak for leak in found if leak is not None]


PROBES: tuple[tuple[str, Callable[[], Any], Callable[[Any], list[Leak]]], ...] = (
    ("module hooks", _module_hooks_take, _module_hooks_check),
    ("torch function modes", _function_modes_take, _function_modes_check),
    ("torch attributes", _attributes_take, _attributes_check),
    ("sys.path", lambda: list(sys.path), _sys_path_check),
    ("sys.modules", lambda: dict(sys.modules), _sys_modules_check),
    ("root logger", _root_logger_take, _root_logger_check),
    ("anomaly mode", _anomaly_take, _anomaly_check),
    ("signal dispositions", _signals_take, _signals_check),
)


@dataclass
class Snapshot:
    states: dict[str, Any]
    threads: set[threading.Thread]
    test_file: str


def snapshot(test_file: str = "") -> Snapshot:
    """The state `check()` compares against; `test_file` is the test module's path (a
    thread running code from it is the test's)."""
    states = {}
    for name, take, _check in PROBES:
        try:
            states[name] = take()
        except Exception:  # noqa: BLE001 - this torch lacks the API: that probe is left out
            continue
    return Snapshot(states, set(threading.enumerate()), test_file.replace("\\", "/"))


def check(before: Snapshot) -> list[Leak]:
    """What the test changed since `before`, each set back where possible (see Leak.restored)."""
    leaks: list[Leak] = []
    for name, _take, check_ in PROBES:
        if name not in before.states:
            continue
        try:
            leaks.extend(check_(before.states[name]))
        except Exception as exc:  # noqa: BLE001 - a probe must never stop the worker
            print(f"distci: could not check {name}: {type(exc).__name__}: {exc}", flush=True)
    leaks.extend(_threads_check(before.threads, before.test_file))
    return leaks
