"""sys.path leak detection under an overlay env (`--python`'s preinstalled stack): a dir an
installed package adds under any site-packages already on sys.path is no leak; anything
else still is (found by the fuzz run of 2026-12-02: setuptools' `_vendor` under the base
stack's site-packages was blamed on the first inductor compile)."""

from __future__ import annotations

import sys

from distci.harness.leaks import _sys_path_check


def test_a_vendor_dir_under_a_site_packages_on_the_path_is_kept(monkeypatch):
    base = "/stacks/base/lib/python3.11/site-packages"
    before = [*sys.path, base]
    monkeypatch.setattr(sys, "path", [*before, f"{base}/setuptools/_vendor"])
    assert _sys_path_check(before) == []
    assert sys.path[-1] == f"{base}/setuptools/_vendor"


def test_any_other_added_dir_is_a_leak_and_is_set_back(monkeypatch):
    base = "/stacks/base/lib/python3.11/site-packages"
    before = [*sys.path, base]
    monkeypatch.setattr(sys, "path", [*before, "/home/someone/scratch"])
    leaks = _sys_path_check(before)
    assert len(leaks) == 1 and "/home/someone/scratch" in leaks[0].what
    assert sys.path == before
