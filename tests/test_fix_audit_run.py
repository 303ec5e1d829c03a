"""The fix audit end to end on the local torch: its env comes from distci.envs (the one
venv primitive, keyed by the stack), and the verdict comes from real off/on runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distci.selfwheels import REPO


@pytest.mark.slow
def test_audit_of_one_fix_on_the_local_torch(tmp_path, monkeypatch):
    from distci.audit import main

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("DISTCI_WHEELHOUSE_ROOT", str(REPO / ".distci" / "wheelhouse"))
    out, cache = tmp_path / "audit", tmp_path / "envs"
    argv = ["--torch", "2.13.0", "--fix", "act_tangent_coercion", "--package", "none", "--out", str(out),
            "--cache", str(cache)]
    assert main(argv) == 0
    audit = json.loads((out / "latest" / "audit.json").read_text())
    (row,) = audit["rows"]
    assert (row["fix"], row["torch"], row["present"], row["verdict"]) == ("act_tangent_coercion", "2.13.0", True,
                                                                          "needed")
    assert row["off"]["outcome"] == "failed" and row["on"]["outcome"] == "passed"
    envs = [p.name for p in cache.iterdir() if p.is_dir()]
    assert any(name.startswith("stack-") for name in envs), envs  # distci.envs' env, not a private venv
