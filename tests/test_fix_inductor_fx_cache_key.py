"""inductor_fx_cache_opaque_key on torch's own key pickler and real DeviceMesh objects.

The pickler is torch's (a subclass with its own __init__ stands in for the module, so the
test patches it whether or not this venv autoloads the fix); the meshes are real ones built
without process groups. The cross-process proof (a second process hits, one with another
mesh compiles) is the regression test, suites/regressions/test_fx_graph_cache_dtensor_redistribute.py.
"""

from __future__ import annotations

import sys
import types

import pytest

from distci.provision.selfwheels import REPO

sys.path.insert(0, str(REPO / "fixes"))  # as tests/test_fixes.py: installed or not
torch = pytest.importorskip("torch")
opaque_object = pytest.importorskip("torch._library.opaque_object")
if not hasattr(opaque_object, "FakeOpaqueObject"):
    pytest.skip("this torch has no opaque objects: a DeviceMesh never enters the FX graph cache key",
                allow_module_level=True)

from torch._inductor import codecache  # noqa: E402
from torch._library.fake_class_registry import FakeScriptObject  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

from distci_fixes.fixes import inductor_fx_cache_opaque_key as fix  # noqa: E402
from distci_fixes.patching import ORIGINAL, patched_by  # noqa: E402


def _stand_in() -> types.ModuleType:
    """A module whose key pickler is torch's as torch ships it (unpatched where this venv autoloads the fix)."""
    init = vars(codecache.FxGraphCachePickler)["__init__"]
    unpatched = getattr(init, ORIGINAL, init)

    class FxGraphCachePickler(codecache.FxGraphCachePickler):
        def __init__(self, *args, **kwargs) -> None:
            unpatched(self, *args, **kwargs)

    module = types.ModuleType("codecache_stand_in")
    module.FxGraphCachePickler = FxGraphCachePickler
    return module


def _mesh(ranks=(0, 1), shape=(2,), names=("tp",), device="cpu", rank=0, root=None) -> DeviceMesh:
    return DeviceMesh(device, torch.tensor(ranks).view(shape), mesh_dim_names=names, _init_backend=False,
                      _rank=rank, _root_mesh=root)


def _key(module: types.ModuleType, mesh: DeviceMesh) -> bytes:
    """What the FX graph cache's key holds for a graph input that is this mesh."""
    fake = FakeScriptObject(opaque_object.FakeOpaqueObject(), "torch.distributed.device_mesh.DeviceMesh", mesh)
    return module.FxGraphCachePickler(None).dumps(fake)


def _salted(mesh: DeviceMesh, salt: int) -> DeviceMesh:
    """The mesh as another process holds it: hash() of the same identity, another PYTHONHASHSEED."""
    hash(mesh)
    mesh._hash = mesh._hash ^ salt
    return mesh


@pytest.fixture
def patched() -> types.ModuleType:
    module = _stand_in()
    assert fix.detect(module), "the unpatched pickler should key a mesh by its salted hash on this torch"
    fix.apply(module)
    return module


def test_unpatched_key_changes_with_the_salt_alone() -> None:
    module = _stand_in()
    assert _key(module, _salted(_mesh(), 1)) != _key(module, _salted(_mesh(), 2))


def test_patched_key_is_the_same_whatever_the_salt(patched: types.ModuleType) -> None:
    assert _key(patched, _salted(_mesh(), 1)) == _key(patched, _salted(_mesh(), 2))


def test_apply_is_idempotent_and_detect_sees_its_own_patch(patched: types.ModuleType) -> None:
    init = patched.FxGraphCachePickler.__init__
    fix.apply(patched)
    assert patched.FxGraphCachePickler.__init__ is init
    assert patched_by(init) == fix.ID
    assert not fix.detect(patched)


@pytest.mark.parametrize("other", [
    dict(names=("dp",)),
    dict(ranks=(0, 1, 2, 3), shape=(2, 2), names=("dp", "tp")),
    dict(ranks=(1, 0)),
    dict(device="meta"),
    dict(rank=1),
], ids=["dim_name", "2d_layout", "rank_map", "device_type", "rank"])
def test_meshes_that_differ_never_share_a_key(patched: types.ModuleType, other: dict) -> None:
    assert _key(patched, _salted(_mesh(), 1)) != _key(patched, _salted(_mesh(**other), 1))


def test_meshes_that_differ_in_their_groups_never_share_a_key(patched: types.ModuleType) -> None:
    one, two = _mesh(), _mesh()
    one._dim_group_names, two._dim_group_names = ["1"], ["2"]
    assert _key(patched, one) != _key(patched, two)


def test_a_mesh_that_reaches_itself_pickles_and_keys_its_root(patched: types.ModuleType) -> None:
    """A flattened mesh points at its root, which maps back to it (the cycle fast pickling cannot follow)."""
    def flattened(root_names: tuple[str, ...], salt: int = 1) -> DeviceMesh:
        root = _salted(_mesh(ranks=(0, 1, 2, 3), shape=(2, 2), names=root_names), salt)
        flat = _salted(_mesh(ranks=(0, 1, 2, 3), shape=(4,), names=("flat",), root=root), salt)
        root._flatten_mapping["flat"] = flat
        return flat

    assert _key(patched, flattened(("dp", "tp"), 1)) == _key(patched, flattened(("dp", "tp"), 2))
    assert _key(patched, flattened(("dp", "tp"))) != _key(patched, flattened(("dp", "cp")))
