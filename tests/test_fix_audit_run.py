"""The fix audit end to end on the local torch: its env comes from distci.provision.envs (the one
venv primitive, keyed by the stack), and the verdict comes from real off/on runs.

It is also CI's proof that act_tangent_coercion is needed on the torch CI runs (2.13.0): its
regression test fails with fixes off, with the upstream error, and passes with the fix on.
tests/test_fixes.py audited the same fix on the same torch a second time (through `--python`,
a path its second-package audit still covers): one audit proves both.

The audit keeps its envs where it does for a person, the checkout's `.distci/torch` (its
`--cache` default, beside the checkout's wheelhouse this test already uses): built once per
checkout, then reused as the audit reuses them, so a run of this test pays the two off/on
pytest runs it proves things with, not a cold torch env each time (~30 CPU-s: the cold
build is tests/test_cellrun.py's default-cell test's to prove)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distci.provision.selfwheels import REPO


@pytest.mark.slow
def test_audit_of_one_fix_on_the_local_torch(tmp_path, monkeypatch):
    from distci.audit.run import main

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("DISTCI_WHEELHOUSE_ROOT", str(REPO / ".distci" / "wheelhouse"))
    out, cache = tmp_path / "audit", REPO / ".distci" / "torch"  # the audit's default --cache
    argv = ["--torch", "2.13.0", "--fix", "act_tangent_coercion", "--package", "none", "--out", str(out)]
    assert main(argv) == 0
    audit = json.loads((out / "latest" / "audit.json").read_text())
    (row,) = audit["rows"]
    assert (row["fix"], row["torch"], row["present"], row["verdict"]) == ("act_tangent_coercion", "2.13.0", True,
                                                                          "needed")
    assert row["off"]["outcome"] == "failed" and row["on"]["outcome"] == "passed"
    upstream = ("_local_tensor", "guessed its metadata", "incorrect subclass metadata", "does not require grad")
    assert any(s in row["off"]["message"] for s in upstream), row["off"]  # off fails with the upstream error
    envs = [p.name for p in cache.iterdir() if p.is_dir()]
    assert any(name.startswith("stack-") for name in envs), envs  # distci.provision.envs' env, not a private venv


def test_a_later_reaudit_replaces_the_rows_it_covers():
    from distci.audit.model import Audit, AuditRow, TestRun
    from distci.audit.report import merge

    def row(fix, torch, on):
        return AuditRow(fix=fix, torch=torch, test="t.py", present=True, in_range=True, status="applied",
                        off=TestRun("failed"), on=TestRun(on))

    first = Audit(versions=["2.6.0", "2.7.0"], rows=[row("a", "2.6.0", "failed"), row("b", "2.6.0", "passed"),
                                                     row("a", "2.7.0", "failed")])
    side = Audit(versions=["2.13.0"], rows=[row("a", "2.13.0", "passed")])
    again = Audit(versions=["2.6.0", "2.7.0"], rows=[row("a", "2.6.0", "passed"), row("a", "2.7.0", "passed")])
    merged = merge([first, side, again])
    verdicts = {(r.fix, r.torch): r.verdict for r in merged.rows}
    assert verdicts == {("a", "2.6.0"): "needed", ("a", "2.7.0"): "needed", ("a", "2.13.0"): "needed",
                        ("b", "2.6.0"): "needed"}, verdicts
    assert len(merged.rows) == 4 and not any(r.verdict == "broken" for r in merged.rows)
    assert merged.versions == ["2.6.0", "2.7.0", "2.13.0"]
