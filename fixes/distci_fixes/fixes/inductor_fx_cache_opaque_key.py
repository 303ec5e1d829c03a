"""Inductor's FX graph and AOTAutograd caches never hit in a new process for a DTensor graph.

Since torch 2.12 a compiled graph that redistributes a DTensor takes its DeviceMesh as an
opaque-object input. The caches' key pickler (`FxGraphCachePickler`, which the AOTAutograd
pickler extends) keys such an input as `(FakeOpaqueObject, type name, real mesh)` and
pickles the real mesh by its `__getstate__`, which holds `_hash`: Python's `hash()` of
the mesh's identity tuple, salted per process by PYTHONHASHSEED. So the key differs in
every process: a restarted job, the next test, a warm CI run all compile again (Dynamo,
AOTAutograd and inductor's lowering). The debug lines show the fake object's address,
but the bytes that differ are the salted hash (distci's repro,
suites/regressions/test_fx_graph_cache_dtensor_redistribute.py; torch 2.12.1, 2.13.0,
2.15.0 miss; 2.11.0, where the mesh is no graph input, hits).

The fix gives each key pickler a reducer for DeviceMesh: the mesh's whole pickled state
as torch keys it (rank map, layout, device type, dim names, process-group names, root
mesh, rank, coordinates), with `_hash` replaced by the same identity tuple hashed stably
(`DeviceMesh._stable_hash`, which the AOTAutograd cache already uses for DTensor's
metadata; where it is missing, `_hash` is dropped only when the fields it hashes are in the
state). Nothing torch keyed on is lost, so two meshes that differ in anything torch
distinguished still get different entries; only the per-process salt goes.

detect(): the bug is present where a DeviceMesh can be an opaque graph input and the key
of such an input changes with the mesh's `_hash` alone (probed by pickling a stand-in
mesh twice: a pickle, no compile, no process group).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Tuple

from distci_fixes.model import Applies, Fix
from distci_fixes.patching import TargetMissing, lookup, package_version, patched_by, wrap

ID = "inductor_fx_cache_opaque_key"
TARGET = "FxGraphCachePickler.__init__"
_SALTED = "_hash"
_HASHED_FIELDS = ("_flatten_rank_map", "_layout", "_device_type", "_mesh_dim_names")
"""What DeviceMesh._hash_key() feeds hash() in torch 2.12 .. 2.15 (plus _thread_id, None
unless the threaded test backend set it)."""


def _device_mesh_type() -> Optional[type]:
    import torch.distributed as dist

    if not dist.is_available():
        return None
    from torch.distributed import device_mesh

    return getattr(device_mesh, "DeviceMesh", None)


def mesh_key(type_name: str) -> str:
    """What a DeviceMesh unpickles to in a key: never called, only named (pickle needs a global)."""
    return type_name


def stable_state(mesh: Any) -> Dict[str, Any]:
    """The mesh's pickled state with the per-process hash made stable (or dropped)."""
    getstate = getattr(mesh, "__getstate__", None)
    pickled = getstate() if callable(getstate) else None
    state = dict(vars(mesh) if pickled is None else pickled)
    state.pop("_pg_registry", None)
    if _SALTED in state:
        stable_hash = getattr(mesh, "_stable_hash", None)
        if callable(stable_hash):
            state[_SALTED] = stable_hash()
        elif all(name in state for name in _HASHED_FIELDS):
            del state[_SALTED]
    return dict(sorted(state.items()))


def _reduce_mesh(pickler: Any, mesh: Any) -> Tuple[Callable[[str], str], Tuple[str], Dict[str, Any]]:
    # A mesh can reach itself (root mesh <-> flattened meshes): pickle's memo, which fast
    # mode turns off, is what keeps that finite; torch turns it off for opaque types too.
    pickler.fast = False
    cls = type(mesh)
    return (mesh_key, (f"{cls.__module__}.{cls.__qualname__}",), stable_state(mesh))


def _with_mesh_reducer(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        mesh_type = _device_mesh_type()
        if mesh_type is not None:
            self.dispatch_table[mesh_type] = functools.partial(_reduce_mesh, self)

    return __init__


def _mesh_is_an_opaque_input(mesh_type: type) -> bool:
    try:
        from torch._library import opaque_object
    except ImportError:
        return False
    from torch.distributed import device_mesh

    # Registered lazily (when DTensor is imported): the registering function says it will be.
    return hasattr(device_mesh, "_register_distributed_opaque_types") or bool(
        getattr(opaque_object, "is_opaque_type", lambda _: False)(mesh_type))


def _key_of_stand_in(codecache: ModuleType, mesh_type: type, salt: int) -> bytes:
    from torch._library.fake_class_registry import FakeScriptObject
    from torch._library.opaque_object import FakeOpaqueObject

    mesh = mesh_type.__new__(mesh_type)
    vars(mesh).update(_device_type="cpu", _mesh_dim_names=("tp",), _flatten_rank_map=(0,), _layout=None,
                      _thread_id=None, _hash=salt)
    fake = FakeScriptObject(FakeOpaqueObject(), f"{mesh_type.__module__}.{mesh_type.__qualname__}", mesh)
    return codecache.FxGraphCachePickler(None).dumps(fake)


def _own_init(codecache: ModuleType) -> Any:
    """The key pickler's own __init__ (an inherited Pickler.__init__ is no target: TargetMissing)."""
    pickler = lookup(codecache, "FxGraphCachePickler")
    if "__init__" not in vars(pickler):
        raise TargetMissing(f"{codecache.__name__}.{TARGET} does not exist in {package_version(codecache.__name__)}")
    return lookup(codecache, TARGET)


def detect(codecache: ModuleType) -> bool:
    mesh_type = _device_mesh_type()
    if mesh_type is None or not _mesh_is_an_opaque_input(mesh_type):
        return False
    if patched_by(_own_init(codecache)) == ID:
        return False
    try:
        from torch._library.opaque_object import FakeOpaqueObject  # noqa: F401
    except ImportError:
        return False
    return _key_of_stand_in(codecache, mesh_type, 1) != _key_of_stand_in(codecache, mesh_type, 2)


def apply(codecache: ModuleType) -> None:
    _own_init(codecache)
    wrap(codecache.FxGraphCachePickler, "__init__", _with_mesh_reducer, ID)


FIX = Fix(
    id=ID,
    title="Inductor's FX graph / AOTAutograd cache keys a DTensor graph's DeviceMesh input by a per-process hash: no hit in a new process",
    upstream=(
        "https://github.com/pytorch/pytorch/pull/184001",
        "https://github.com/pytorch/pytorch/pull/173526",
    ),
    applies=Applies(releases=">=2.5"),  # detect() decides: the mesh is an input since 2.12
    target="torch._inductor.codecache",
    detect=detect,
    apply=apply,
    test="suites/regressions/test_fx_graph_cache_dtensor_redistribute.py",
)
