"""The fix audit's "obsolete since WHICH upstream change": a find-fix bisect per fix.

The audit (distci/audit.py) says a fix is obsolete since version X: its regression test
fails with fixes off on the last audited version before X and passes from X on. Between
those two audited versions lie releases the audit did not run; `bisect_audit` runs a
find-fix bisect of the fix's regression test (fixes off, through the harness, as bisect
probes always do) over the torch releases between them, and the answer is the first
release where the bug is gone plus the compare link between the two releases' tags. Only
torch is an axis of the audit; a fix targeting torchao or torchtitan is bisected the
same way by `distci bisect --axis torchtitan --repo ...` on that package's commits.

`nox -s fixes_audit -- --bisect` runs it after the audit and writes its table next to
the audit's (and into --report).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from distci.errors import DistciError

COMPARE = "https://github.com/pytorch/pytorch/compare/v{old}...v{new}"
Log = Callable[[str], None]


@dataclass(frozen=True)
class FixChange:
    """Where an audited fix's bug disappears: present at `last_present`, gone from
    `first_absent` (the next audited version) on."""

    fix: str
    test: str
    last_present: str
    first_absent: str


@dataclass
class FixBisect:
    change: FixChange
    status: str
    first_good: str = ""
    probes: int = 0
    report: str = ""
    reason: str = ""

    @property
    def link(self) -> str:
        old = self.change.last_present if not self.first_good else _previous(self)
        return COMPARE.format(old=old, new=self.first_good or self.change.first_absent)


def changes(rows: Sequence[Any]) -> list[FixChange]:
    """From audit rows (fix, torch, test, off.outcome), each fix's last present -> first
    absent pair, where the bug is gone from then on (the audit's `obsolete since`)."""
    from packaging.version import Version

    by_fix: dict[str, list[Any]] = {}
    for row in rows:
        by_fix.setdefault(row.fix, []).append(row)
    found = []
    for fix, fix_rows in sorted(by_fix.items()):
        fix_rows.sort(key=lambda r: Version(r.torch))
        failed = [i for i, r in enumerate(fix_rows) if r.off.outcome == "failed"]
        if not failed or failed[-1] + 1 >= len(fix_rows):
            continue
        later = fix_rows[failed[-1] + 1]
        if later.off.outcome == "passed":
            found.append(FixChange(fix, later.test, fix_rows[failed[-1]].torch, later.torch))
    return found


def bisect_audit(rows: Sequence[Any], *, out: Path, log: Log = print,
                 extra: Sequence[str] = ()) -> list[FixBisect]:
    """A find-fix bisect over the torch releases of each obsolete fix's change; `extra`
    are more `distci bisect` options (e.g. --index-url, --find-links)."""
    from distci.bisect.args import BisectArgs
    from distci.bisect.command import main

    answers = []
    for change in changes(rows):
        log(f"fix {change.fix}: bug present on {change.last_present}, gone on {change.first_absent}: "
            "bisecting the releases between them")
        report = out / "bisect" / f"{change.fix}.json"
        args = BisectArgs(test_id=change.test, axis="torch", source="release", find_fix=True,
                          bad=change.last_present, good=change.first_absent, report=str(report),
                          out=str(out / "bisect"))
        for option in _pairs(extra):
            setattr(args, *option)
        try:
            main(args, log=log)
        except DistciError as exc:
            answers.append(FixBisect(change, "error", reason=str(exc), report=str(report)))
            continue
        import json

        data = json.loads(report.read_text())
        answers.append(FixBisect(change, data["kind"], first_good=(data.get("first_good") or "").split("==")[-1],
                                 probes=data.get("distinct_probes", 0), report=str(report),
                                 reason=data.get("reason", "")))
    return answers


def to_markdown(answers: Sequence[FixBisect]) -> str:
    lines = ["## Obsolete since which upstream change", "",
             "| fix | bug present | gone | first good release (bisect) | probes | change |",
             "|---|---|---|---|---:|---|"]
    for a in answers:
        landed = a.first_good or a.status
        lines.append(f"| `{a.change.fix}` | {a.change.last_present} | {a.change.first_absent} | "
                     f"{landed} | {a.probes} | {a.link} |")
    if not answers:
        lines.append("| (no fix became obsolete between two audited versions) | | | | | |")
    return "\n".join(lines) + "\n"


def _previous(answer: FixBisect) -> str:
    """The release before the first good one: the last bad the bisect saw."""
    import json

    try:
        data = json.loads(Path(answer.report).read_text())
    except (OSError, ValueError):
        return answer.change.last_present
    return (data.get("last_bad") or answer.change.last_present).split("==")[-1]


def _pairs(extra: Sequence[str]) -> list[tuple[str, Any]]:
    """`--index-url URL --find-links DIR` as BisectArgs fields."""
    out: list[tuple[str, Any]] = []
    items = list(extra)
    while items:
        flag = items.pop(0)
        name = flag.lstrip("-").replace("-", "_")
        value: Any = items.pop(0) if items else ""
        if name == "find_links":
            value = [value]
        out.append((name, value))
    return out
