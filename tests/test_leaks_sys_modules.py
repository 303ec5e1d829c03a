"""sys.modules leak detection: an entry a package sets while it is first imported, holding an
object of that package's own class, is no leak (found on torch 2.11 outside the matrix:
Cython's `Cython.Shadow` sets `cython.parallel` / `cython.cimports` stand-ins the first time
torch's C++ builder imports it, and the test in flight was failed for it); a fake set by a
test is still a leak and is removed."""

from __future__ import annotations

import sys
import types

import pytest

from distci.harness.leaks import _sys_modules_check

_SHADOW = '''
import sys
class Stand_in:
    def __init__(self, name):
        self.name = name
sys.modules["distci_shadowed.parallel"] = Stand_in("distci_shadowed.parallel")
'''


def _import_a_new_package(tmp_path, monkeypatch, name: str) -> None:
    (tmp_path / f"{name}.py").write_text(_SHADOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__(name)


def test_stand_ins_a_newly_imported_package_sets_are_kept(tmp_path, monkeypatch):
    before = dict(sys.modules)
    try:
        _import_a_new_package(tmp_path, monkeypatch, "distci_shadow_new")
        assert _sys_modules_check(before) == []
        assert "distci_shadowed.parallel" in sys.modules
    finally:
        sys.modules.pop("distci_shadowed.parallel", None)
        sys.modules.pop("distci_shadow_new", None)


def test_a_stand_in_of_a_package_imported_before_the_test_is_a_leak(tmp_path, monkeypatch):
    _import_a_new_package(tmp_path, monkeypatch, "distci_shadow_old")
    try:
        sys.modules.pop("distci_shadowed.parallel")
        before = dict(sys.modules)
        stand_in = type(sys.modules["distci_shadow_old"].Stand_in("x"))("distci_shadowed.parallel")
        sys.modules["distci_shadowed.parallel"] = stand_in
        leaks = _sys_modules_check(before)
        assert [leak.what for leak in leaks] == ["sys.modules['distci_shadowed.parallel'] set by hand (distci_shadow_old.Stand_in)"]
        assert "distci_shadowed.parallel" not in sys.modules
    finally:
        sys.modules.pop("distci_shadowed.parallel", None)
        sys.modules.pop("distci_shadow_old", None)


def test_a_bare_fake_module_is_a_leak_and_is_removed():
    before = dict(sys.modules)
    sys.modules["distci_fake_by_hand"] = types.ModuleType("distci_fake_by_hand")
    try:
        leaks = _sys_modules_check(before)
        assert len(leaks) == 1 and "distci_fake_by_hand" in leaks[0].what and leaks[0].restored
        assert "distci_fake_by_hand" not in sys.modules
    finally:
        sys.modules.pop("distci_fake_by_hand", None)



@pytest.mark.parametrize("name, leaks", [("_cython_9_9_9", 0), ("_cython_fake", 1)])
def test_cythons_shared_types_module_is_no_leak(name, leaks):
    """Cython-compiled extensions create `_cython_X_Y_Z` with PyModule_New on first import;
    a bare module by any other name is still a leak."""
    before = dict(sys.modules)
    sys.modules[name] = types.ModuleType(name)
    try:
        assert len(_sys_modules_check(before)) == leaks
    finally:
        sys.modules.pop(name, None)
