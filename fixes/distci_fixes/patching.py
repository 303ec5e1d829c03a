"""Small helpers fixes use to find and replace their patch targets.

A target that upstream renamed or removed must turn into a `broken` record, not an
AttributeError in a training job: `lookup` raises TargetMissing, which the engine
records. Every replacement carries a marker naming the fix, which keeps apply()
idempotent and lets detect() recognise its own patch.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, Callable

MARKER = "__distci_fix__"
ORIGINAL = "__distci_original__"


class TargetMissing(LookupError):
    """The attribute a fix patches is not there in this version of its package."""


def package_version(module_name: str) -> str:
    """`torchtitan 0.3.0` for any module of torchtitan: the package a missing target belongs to."""
    package = module_name.split(".")[0]
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"{package} {version(package)}"
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    import sys

    found = getattr(sys.modules.get(package), "__version__", None)
    return f"{package} {found}" if found else package


def lookup(module: ModuleType, path: str) -> Any:
    """`module.a.b.c` for path "a.b.c", raw (a staticmethod stays a staticmethod)."""
    obj: Any = module
    walked = module.__name__
    for name in path.split("."):
        try:
            obj = inspect.getattr_static(obj, name)
        except AttributeError:
            raise TargetMissing(f"{walked}.{name} does not exist in {package_version(module.__name__)}") from None
        walked = f"{walked}.{name}"
    return obj


def function_of(obj: Any) -> Callable[..., Any]:
    """The plain function behind a function, staticmethod or classmethod."""
    fn = getattr(obj, "__func__", obj)
    if not inspect.isfunction(fn):
        raise TargetMissing(f"{obj!r} is not a Python function")
    return fn


def patched_by(obj: Any) -> str:
    """The id of the fix that installed `obj`, or ""."""
    return str(getattr(function_of(obj), MARKER, ""))


def source_of(obj: Any) -> str:
    """The source text of a function (linecache-backed: a few ms, no import)."""
    try:
        return inspect.getsource(function_of(obj))
    except (OSError, TypeError) as err:
        raise TargetMissing(f"no source for {obj!r}: {err}") from None


def replace(owner: Any, name: str, new: Callable[..., Any], fix_id: str) -> None:
    """Set owner.name = new (wrapped like the original), marked as fix_id's. Idempotent."""
    old = inspect.getattr_static(owner, name)
    if patched_by(old) == fix_id:
        return
    setattr(new, MARKER, fix_id)
    setattr(new, ORIGINAL, function_of(old))
    if isinstance(old, staticmethod):
        setattr(owner, name, staticmethod(new))
    elif isinstance(old, classmethod):
        setattr(owner, name, classmethod(new))
    else:
        setattr(owner, name, new)


def wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]], fix_id: str) -> None:
    """Set owner.name = make(original), marked as fix_id's. Idempotent: a second call keeps
    the first wrapper (it never wraps a wrapper). A missing target raises TargetMissing."""
    original = function_of(lookup(owner, name))
    if patched_by(original) != fix_id:
        replace(owner, name, make(original), fix_id)


def restore(owner: Any, name: str) -> None:
    """Undo replace() (tests use it to return a process to the unpatched state)."""
    current = inspect.getattr_static(owner, name)
    original = getattr(function_of(current), ORIGINAL, None)
    if original is None:
        return
    if isinstance(current, staticmethod):
        setattr(owner, name, staticmethod(original))
    elif isinstance(current, classmethod):
        setattr(owner, name, classmethod(original))
    else:
        setattr(owner, name, original)
