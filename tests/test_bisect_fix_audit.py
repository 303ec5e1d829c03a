"""The fix audit's bisect question: from audit rows to (last present, first absent)."""

from __future__ import annotations

from distci.audit.model import AuditRow, TestRun
from distci.bisect.fix_audit import FixBisect, FixChange, changes, to_markdown


def row(fix: str, torch: str, off: str) -> AuditRow:
    return AuditRow(fix=fix, torch=torch, test=f"suites/regressions/test_{fix}.py", present=off == "failed",
                    in_range=True, status="applied", off=TestRun(off), on=TestRun("passed"))


def test_each_fix_is_bisected_between_its_last_failing_and_the_next_passing_version():
    rows = [row("wait", v, o) for v, o in [("2.6.0", "passed"), ("2.5.1", "failed"), ("2.7.0", "passed")]]
    rows += [row("still", v, "failed") for v in ("2.5.1", "2.6.0")]  # needed everywhere: nothing to bisect
    rows += [row("back", v, o) for v, o in [("2.5.1", "failed"), ("2.6.0", "passed"), ("2.7.0", "failed")]]
    rows += [row("gap", v, o) for v, o in [("2.5.1", "failed"), ("2.6.0", "infra")]]
    assert changes(rows) == [FixChange("wait", "suites/regressions/test_wait.py", "2.5.1", "2.6.0")]


def test_the_table_links_the_change_between_the_two_releases():
    change = FixChange("wait", "t.py", "2.5.1", "2.6.0")
    table = to_markdown([FixBisect(change, "boundary", first_good="2.6.0", probes=2, report="missing.json")])
    assert "| `wait` | torch | 2.5.1 | 2.6.0 | 2.6.0 | 2 | https://github.com/pytorch/pytorch/compare/v2.5.1...v2.6.0 |" in table


def package_row(fix: str, torch: str, package: str, off: str) -> AuditRow:
    r = row(fix, torch, off)
    r.package = package
    return r


def test_a_package_fix_is_bisected_on_that_packages_commits(monkeypatch, tmp_path):
    from distci.bisect.fix_audit import bisect_audit

    rows = [package_row("titan", t, f"torchtitan=={p}", o) for t, p, o in [
        ("2.10.0", "0.2.2", "failed"), ("2.10.0", "0.3.0", "skipped"),  # 0.3.0 does not run there
        ("2.13.0", "0.3.0", "passed"), ("2.13.0", "0.2.2", "failed"),
        ("2.14.1", "0.2.2", "failed"), ("2.14.1", "0.3.0", "passed")]]
    found = changes(rows)
    assert found == [FixChange("titan", "suites/regressions/test_titan.py", "0.2.2", "0.3.0", axis="torchtitan",
                               torch="2.13.0")], found
    # no clone configured: the row says what to set, nothing runs
    monkeypatch.delenv("DISTCI_GIT_TORCHTITAN", raising=False)
    (answer,) = bisect_audit(rows, out=tmp_path, log=lambda line: None, package_env=lambda change: tmp_path)
    assert answer.status == "not run" and "DISTCI_GIT_TORCHTITAN" in answer.reason
    table = to_markdown([answer])
    assert "| `titan` | torchtitan (torch 2.13.0) | 0.2.2 | 0.3.0 | not run: set DISTCI_GIT_TORCHTITAN" in table
    assert "https://github.com/pytorch/torchtitan/compare/v0.2.2...v0.3.0" in table
    landed = FixBisect(found[0], "boundary", first_good="737594746abc", probes=9, report="missing.json")
    assert "https://github.com/pytorch/torchtitan/commit/737594746abc" in to_markdown([landed])
