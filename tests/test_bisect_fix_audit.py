"""The fix audit's bisect question: from audit rows to (last present, first absent)."""

from __future__ import annotations

from distci.audit import AuditRow, TestRun
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
    assert "| `wait` | 2.5.1 | 2.6.0 | 2.6.0 | 2 | https://github.com/pytorch/pytorch/compare/v2.5.1...v2.6.0 |" in table
