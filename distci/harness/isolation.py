"""Per-test isolation inside a long-lived rank worker.

A worker runs many tests. Without a reset, Dynamo's caches and recompile counters carry
over, so after enough tests a compile scenario would silently fall back to eager; a
config flipped by one test would leak into the next; RNG would depend on test order.
`snapshot()` captures the configs once at worker start; `reset()` restores them.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

_CONFIG_MODULES = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")


def _config_module(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except Exception:
        return None


def snapshot() -> dict[str, Any]:
    """Config state to restore before every test (torch's own save_config where present)."""
    saved: dict[str, Any] = {}
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
        for name, (_how, state) in saved.items():
            mod = _config_module(name)
            if mod is not None and hasattr(mod, "load_config"):
                mod.load_config(state)


def reseed(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def reset(saved: dict[str, Any], seed: int) -> None:
    """Everything a test may have changed that would change the next test's meaning."""
    import torch

    torch._dynamo.reset()
    try:
        from torch._dynamo.utils import counters

        counters.clear()
    except Exception:
        pass
    restore(saved)
    reseed(seed)
