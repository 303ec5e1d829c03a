"""Run a callback right after a module is first imported.

Fixes are armed while `import torch` is still running, when their targets (DTensor's
parallel styles, functional collectives, Inductor passes) are not imported yet and
importing them there would be slow and could re-enter a half-initialised torch. So a
fix waits for its target: a meta-path finder wraps the target's loader and calls back
once the module has executed, before the importer gets it back.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional

Callback = Callable[[ModuleType], None]


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader; after exec_module, runs the callbacks."""

    def __init__(self, inner: Any, fire: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._fire = fire

    def create_module(self, spec: Any) -> Optional[ModuleType]:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        module.__loader__ = self._inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._inner
        self._fire(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._callbacks: Dict[str, List[Callback]] = {}
        self._lock = threading.RLock()

    def add(self, name: str, callback: Callback) -> None:
        with self._lock:
            self._callbacks.setdefault(name, []).append(callback)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self._callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self._fire)
        return spec

    def _fire(self, module: ModuleType) -> None:
        with self._lock:
            callbacks = self._callbacks.pop(module.__name__, [])
        for callback in callbacks:
            callback(module)


_finder = _Finder()


def when_imported(name: str, callback: Callback) -> None:
    """Call `callback(module)` now if `name` is imported, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _finder.add(name, callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
