"""The fix audit's records and its judgement: what one audited run was, what a row means.

The run module fills these from pytest runs, the report module renders and merges
them; both import this one, so neither imports the other.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


@dataclass
class TestRun:
    """One pytest run of a regression test file in one mode."""

    outcome: str  # passed | failed | skipped | infra
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    message: str = ""
    seconds: float = 0.0
    same_as_off: bool = False  # the fix was not applied with it on, so the on run would be the off run


@dataclass
class AuditRow:
    fix: str
    torch: str
    test: str
    present: Optional[bool]
    in_range: Optional[bool]
    status: str
    off: TestRun
    on: TestRun
    verdict: str = ""
    package: str = ""  # the third-party package installed for this row ("torchtitan==0.3.0"), if any


@dataclass
class Audit:
    versions: list[str]
    rows: list[AuditRow] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)
    autoload: dict[str, bool] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    started: str = ""
    seconds: float = 0.0


def module_of(test: str) -> str:
    """pytest's JUnit classname prefix for a test file: suites/regressions/test_x.py -> suites.regressions.test_x."""
    return (test[:-3] if test.endswith(".py") else test).replace("/", ".")


def same_file(classname: str, module: str) -> bool:
    """Is a JUnit classname (`pkg.test_x[.TestClass]`, rootdir-relative) one of `module`'s?"""
    module = "." + module.strip(".")
    without_class = classname.rsplit(".", 1)[0]
    return any(module.endswith("." + n) for n in (classname, without_class)) or classname.startswith(module[1:] + ".")


def junit_counts(path: Path, test: Optional[str] = None) -> tuple[int, int, int, str]:
    """passed, failed, skipped and the first failure of the testcases (of `test`'s file only, if given)."""
    root = ET.parse(path).getroot()
    module = module_of(test) if test else None
    passed = failed = skipped = 0
    message = ""
    for case in root.iter("testcase"):
        classname = case.get("classname", "")
        if module and not same_file(classname, module):
            continue
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            failed += 1
            if not message:
                message = f"{case.get('name')}: {(bad.get('message') or bad.text or '').strip()}"
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, message


KIND_PREFIX = re.compile(r"(?:Failed: )?\[(?:assert|exception|timeout|hang|crash|infra)\] ")


def first_line(message: str, limit: int = 240) -> str:
    """The error as one line: a message's first sentence, its wrapped lines joined."""
    words: list[str] = []
    for line in message.splitlines():
        line = KIND_PREFIX.sub("", line).strip()
        if line.startswith(("---", "Traceback", "[rank")):
            break
        if not line:
            if words:
                break
            continue
        words.append(line)
        text = " ".join(words)
        if len(text) >= limit or text.endswith((".", ")")):
            break
    return " ".join(" ".join(words).split())[:limit]


def version_key(version: str) -> Any:
    from packaging.version import Version

    return Version(version)


ABSENT_EVERYWHERE = "absent in every audited version"


def judge(rows: list[AuditRow]) -> None:
    """Fill each row's verdict; needs all versions of a fix (per package version) to place `obsolete since`.

    `since` is the first version after the last one whose off run failed (the bug
    present) whose off run passed; a fix whose off run failed nowhere is absent in every
    audited version, which says nothing about versions before the oldest audited.
    """
    by_fix: dict[tuple[str, str], list[AuditRow]] = {}
    for row in rows:
        by_fix.setdefault((row.fix, row.package), []).append(row)
    for fix_rows in by_fix.values():
        fix_rows.sort(key=lambda r: version_key(r.torch))
        needed_at = [i for i, r in enumerate(fix_rows) if r.off.outcome == "failed"]
        last_needed = needed_at[-1] if needed_at else None
        since = None
        if last_needed is not None:
            since = next((r.torch for r in fix_rows[last_needed + 1:] if r.off.outcome == "passed"), None)
        for i, row in enumerate(fix_rows):
            if "infra" in (row.off.outcome, row.on.outcome):
                row.verdict = "infra"
            elif row.on.outcome == "skipped" and row.off.outcome == "skipped":
                row.verdict = "n/a"
            elif row.on.outcome == "failed":
                row.verdict = "broken"
            elif row.off.outcome == "failed":
                row.verdict = "needed"
            elif last_needed is None:
                row.verdict = ABSENT_EVERYWHERE
            elif i < last_needed:
                row.verdict = "not affected"
            else:
                row.verdict = f"obsolete since {since}"


def target_package(target: str) -> str:
    return target.split(".")[0]


NOT_APPLIED = ("out_of_range", "not_needed", "disabled")
