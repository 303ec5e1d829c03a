"""Per-test isolation inside a long-lived rank worker.

A worker runs many tests. Without a reset, Dynamo's caches and recompile counters carry
over, so after enough tests a compile scenario would silently fall back to eager; a
config flipped by one test would leak into the next; RNG would depend on test order.
`snapshot()` captures the configs once at worker start; `reset()` restores them and
empties DTensor's sharding caches (`clear_dtensor_caches`).

Process-wide torch and Python state is restored too (`GLOBALS`: default dtype and
device, thread count, deterministic algorithms, grad and inference mode, autocast,
matmul precision, os.environ, cwd, warnings filters): each entry is a (name, get, set)
row; a getter that raises (an API this torch lacks) leaves its row out, and a value is
set back only when it differs, so restoring costs nothing and warns about nothing
when the test changed nothing.
"""

from __future__ import annotations

import os
import random
import warnings
from typing import Any, Callable

_CONFIG_MODULES = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")


def _config_module(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except Exception:
        return None


def snapshot() -> dict[str, Any]:
    """Config state to restore before every test (torch's own save_config where present)."""
    saved: dict[str, Any] = {"globals": snapshot_globals()}
    for name in _CONFIG_MODULES:
        mod = _config_module(name)
        if mod is None:
            continue
        try:
            saved[name] = ("pickle", mod.save_config())
        except (AttributeError, KeyError):
            # torch 2.5's save_config() raises KeyError ('constant_functions' is listed in
            # _save_config_ignore but absent); copy the config dict ourselves instead.
            saved[name] = ("pickle", _save_config_fallback(mod))
    return saved


def _save_config_fallback(mod) -> bytes:
    import pickle

    config = dict(getattr(mod, "_config", {}) or mod.get_config_copy())
    for key in getattr(mod, "_save_config_ignore", ()):
        config.pop(key, None)
    return pickle.dumps(config, protocol=2)


def restore(saved: dict[str, Any]) -> None:
    # Restoring re-sets deprecated keys too, which warns on every test; those warnings
    # would drown the rank logs without telling anyone anything.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, value in saved.items():
            if name == "globals":
                continue
            _how, state = value
            mod = _config_module(name)
            if mod is not None and hasattr(mod, "load_config"):
                mod.load_config(state)


_inference_guards: list = []  # guards that switched a leaked inference mode off again


def _torch():
    import torch

    return torch


def _set_inference_mode(enabled: bool) -> None:
    if not enabled:
        _inference_guards.append(_torch()._C._InferenceMode(False))


def _set_default_device(device) -> None:
    # cpu is the default without any device mode installed; setting it would install one
    _torch().set_default_device(None if str(device) == "cpu" else device)


def _set_deterministic(state: tuple[bool, bool]) -> None:
    _torch().use_deterministic_algorithms(state[0], warn_only=state[1])


def _autocast_devices() -> tuple[str, ...]:
    torch = _torch()
    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def _get_autocast() -> dict[str, tuple[bool, Any]]:
    torch = _torch()
    return {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _autocast_devices()}


def _set_autocast(state: dict[str, tuple[bool, Any]]) -> None:
    torch = _torch()
    for device, (enabled, dtype) in state.items():
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)
    torch.clear_autocast_cache()


def _get_tf32() -> tuple[bool, bool]:
    torch = _torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32)


def _set_tf32(state: tuple[bool, bool]) -> None:
    torch = _torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = state


def _set_environ(saved: dict[str, str]) -> None:
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _set_warning_filters(saved: list) -> None:
    warnings.filters[:] = saved
    for name in ("_filters_mutated", "_filters_mutated_lock_held"):
        mutated = getattr(warnings, name, None)
        if mutated is not None:
            try:
                mutated()
                break
            except Exception:  # noqa: BLE001 - a private hook that changed its contract
                continue


GLOBALS: tuple[tuple[str, Callable[[], Any], Callable[[Any], None]], ...] = (
    ("default dtype", lambda: _torch().get_default_dtype(), lambda v: _torch().set_default_dtype(v)),
    ("default device", lambda: _torch().get_default_device(), _set_default_device),
    ("num threads", lambda: _torch().get_num_threads(), lambda v: _torch().set_num_threads(v)),
    ("deterministic algorithms", lambda: (_torch().are_deterministic_algorithms_enabled(),
                                          _torch().is_deterministic_algorithms_warn_only_enabled()), _set_deterministic),
    # inference mode before grad mode: leaving inference mode switches grad mode on
    ("inference mode", lambda: _torch().is_inference_mode_enabled(), _set_inference_mode),
    ("grad mode", lambda: _torch().is_grad_enabled(), lambda v: _torch().set_grad_enabled(v)),
    ("autocast", _get_autocast, _set_autocast),
    ("matmul precision", lambda: _torch().get_float32_matmul_precision(),
     lambda v: _torch().set_float32_matmul_precision(v)),
    ("tf32", _get_tf32, _set_tf32),
    ("os.environ", lambda: dict(os.environ), _set_environ),
    ("cwd", os.getcwd, os.chdir),
    ("warnings filters", lambda: list(warnings.filters), _set_warning_filters),
)


def snapshot_globals() -> dict[str, Any]:
    saved: dict[str, Any] = {}
    for name, get, _set in GLOBALS:
        try:
            saved[name] = get()
        except Exception:  # noqa: BLE001 - this torch lacks the API: nothing to restore
            continue
    return saved


def restore_globals(saved: dict[str, Any]) -> list[str]:
    """Sets back every global that differs from `saved`; returns the names it restored."""
    restored = []
    for name, get, set_ in GLOBALS:
        if name not in saved:
            continue
        try:
            if get() != saved[name]:
                set_(saved[name])
                restored.append(name)
        except Exception as exc:  # noqa: BLE001 - report, never stop the worker
            print(f"distci: could not restore {name}: {exc}", flush=True)
    return restored


def reseed(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def clear_dtensor_caches() -> list[str]:
    """DTensor's sharding-propagation and redistribute-plan caches emptied, so a test's
    placements are decided for it and not by an earlier test's cache entry: torch 2.10's
    embedding-backward strategy was cached without the vocabulary size, so a TP row of
    vocab 257 after one of 256 got the earlier row's gradient shape (pytorch#174727;
    suites/regressions/test_pytorch174727_embedding_backward_cache.py keeps that bug in
    view, in one test). Each cache is looked up where this torch keeps it; one it lacks is
    skipped. The names of the caches cleared."""
    import sys

    cleared = []
    tensor_mod = sys.modules.get("torch.distributed.tensor")
    if tensor_mod is None:  # no test used DTensor: nothing cached
        return cleared
    dispatcher = getattr(getattr(tensor_mod, "DTensor", None), "_op_dispatcher", None)
    propagator = getattr(dispatcher, "sharding_propagator", None)
    redistribute = sys.modules.get("torch.distributed.tensor._redistribute")
    for name, owner, attr in (("propagate_op_sharding", propagator, "propagate_op_sharding"),
                              ("_gen_transform_infos", redistribute, "_gen_transform_infos")):
        clear = getattr(getattr(owner, attr, None), "cache_clear", None)
        if clear is not None:
            clear()
            cleared.append(name)
    meta = getattr(type(propagator), "_propagate_tensor_meta", None)  # a class-level lru_cache
    if hasattr(meta, "cache_clear"):
        meta.cache_clear()
        cleared.append("_propagate_tensor_meta")
    planner = getattr(redistribute, "clear_redistribute_planner_cache", None)
    if planner is not None:
        planner()
        cleared.append("redistribute_planner")
    native = getattr(sys.modules["torch"]._C, "_clear_DTensor_sharding_propagator_cache", None)  # C++ fast path
    if native is not None:
        native()
        cleared.append("native_sharding_propagator")
    return cleared


def reset(saved: dict[str, Any], seed: int) -> None:
    """Everything a test may have changed that would change the next test's meaning."""
    import torch

    torch._dynamo.reset()
    clear_dtensor_caches()
    try:
        from torch._dynamo.utils import counters

        counters.clear()
    except Exception:
        pass
    restore(saved)
    restore_globals(saved.get("globals", {}))
    reseed(seed)
