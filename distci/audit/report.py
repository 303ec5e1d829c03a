"""Rendering of a fix audit (distci/audit/run.py): the markdown table, the terminal table, and
re-reading (and merging) audits written to disk. Kept apart so the audit itself stays one
screenful of orchestration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from distci.audit.model import Audit, AuditRow, TestRun, first_line, junit_counts, version_key, judge


def _yes_no(value: Optional[bool]) -> str:
    return {True: "yes", False: "no", None: "?"}[value]


def _outcome(run: TestRun) -> str:
    if run.same_as_off:
        return "= off (not applied)"
    counts = f"{run.passed}/{run.passed + run.failed + run.skipped}"
    return f"{run.outcome} ({counts})" if run.outcome in ("passed", "failed") else run.outcome


def _fix_label(row: AuditRow) -> str:
    return f"{row.fix} ({row.package.replace('==', ' ')})" if row.package else row.fix


def _row_dir(row: AuditRow) -> str:
    return f"{row.fix}+{row.package.replace('==', '-')}" if row.package else row.fix


def to_markdown(audit: Audit) -> str:
    lines = [
        "# Fix audit",
        "",
        f"Torch versions: {', '.join(audit.versions)} (CPU, gloo, 2 ranks; run {audit.started}, "
        f"{audit.seconds / 60:.0f} min). Each fix's regression test ran through the harness with "
        "`DISTCI_FIXES=none` (off) and with only that fix on (on); off/on show passed/total test cases "
        "(a case that skips itself, such as a GPU-only one on CPU, counts in the total). "
        "`bug present` is the fix's detect() with fixes off; `fix applied` its status with fixes on. "
        "`= off (not applied)`: with it on the fix was not applied (out of range, or detect() found the bug "
        "absent), so that process is the off one and the off run stands for the on run.",
        "",
        *([f"Added to every run's environment: {', '.join(f'`{k}={v}`' for k, v in audit.env.items())}.", ""]
          if audit.env else []),
        *([f"Fixes for a third-party package ran once per version of it ({', '.join(audit.packages)}), in a "
           "venv with that package next to each torch in the fix's range; `obsolete since` is judged per "
           "package version.", ""] if audit.packages else []),
        "| fix | torch | bug present | fix applied | off | on | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in audit.rows:
        lines.append(f"| {_fix_label(row)} | {row.torch} | {_yes_no(row.present)} | {row.status} | "
                     f"{_outcome(row.off)} | {_outcome(row.on)} | {row.verdict} |")
    lines += ["", "## Upstream errors with fixes off", ""]
    for row in audit.rows:
        if row.off.outcome == "failed":
            lines.append(f"- {_fix_label(row)} @ {row.torch}: `{row.off.message.replace('`', chr(39))}`")
    broken = [r for r in audit.rows if r.verdict == "broken"]
    if broken:
        lines += ["", "## Failures with the fix on", ""]
        lines += [f"- {_fix_label(r)} @ {r.torch}: `{r.on.message.replace('`', chr(39))}`" for r in broken]
    lines += ["", "## torch.backends entry point (fixes armed by `import torch`)", ""]
    lines += [f"- torch {v}: {'yes' if ok else 'NO: call distci_fixes.apply()'}" for v, ok in audit.autoload.items()]
    return "\n".join(lines) + "\n"


def reload(out: Path) -> Audit:
    """An audit as written to `out` (audit.json), its messages re-read from the JUnit files."""
    data = json.loads((out / "audit.json").read_text())
    rows = []
    for raw in data.pop("rows"):
        row = AuditRow(**{**raw, "off": TestRun(**raw["off"]), "on": TestRun(**raw["on"])})
        base = out / row.torch / (_row_dir(row) if row.package else "")
        for run, junit in ((row.off, base / "junit-none.xml"), (row.on, base / row.fix / f"junit-{row.fix}.xml")):
            if junit.exists() and run.outcome == "failed" and not run.same_as_off:
                run.message = first_line(junit_counts(junit, row.test)[3])
        rows.append(row)
    return Audit(rows=rows, **data)


def merge(audits: Sequence[Audit]) -> Audit:
    """One audit of several runs' rows, judged together. Runs side by side cover disjoint
    versions; a later re-audit of some fixes (`--fix ID`, after a fix changed) replaces
    the earlier rows of the same (fix, torch, package): audits are given oldest first."""
    if len(audits) == 1:
        return audits[0]
    merged = Audit(versions=sorted({v for a in audits for v in a.versions}, key=version_key),
                   packages=sorted({p for a in audits for p in a.packages}),
                   started=", ".join(a.started for a in audits), seconds=max(a.seconds for a in audits),
                   env={k: v for a in audits for k, v in a.env.items()})
    rows: dict[tuple[str, str, str], Any] = {}
    for a in audits:
        for row in a.rows:
            rows[(row.fix, row.torch, row.package)] = row
        merged.autoload.update(a.autoload)
    merged.rows = list(rows.values())
    merged.rows.sort(key=lambda r: (version_key(r.torch), r.package))
    merged.autoload = dict(sorted(merged.autoload.items(), key=lambda kv: version_key(kv[0])))
    judge(merged.rows)
    return merged


def print_table(audit: Audit) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fix audit")
    for column in ("fix", "torch", "bug present", "fix applied", "off", "on", "verdict"):
        table.add_column(column)
    colours = {"needed": "green", "broken": "red", "infra": "yellow"}
    for row in audit.rows:
        colour = colours.get(row.verdict, "cyan" if row.verdict.startswith("obsolete") else "white")
        table.add_row(_fix_label(row), row.torch, _yes_no(row.present), row.status, _outcome(row.off), _outcome(row.on),
                      f"[{colour}]{row.verdict}[/{colour}]")
    Console().print(table)


