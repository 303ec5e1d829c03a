"""The fix audit's "obsolete since WHICH upstream change": a find-fix bisect per fix.

The audit (distci/audit/run.py) says a fix is obsolete since version X: its regression test
fails with fixes off on the last audited version before X and passes from X on. Between
those two audited versions lie releases the audit did not run; `bisect_audit` runs a
find-fix bisect of the fix's regression test (fixes off, through the harness, as bisect
probes always do) over the torch releases between them, and the answer is the first
release where the bug is gone plus the compare link between the two releases' tags.

A fix for a third-party package (torchtitan) is audited per package version on each
torch; where its bug is present with one package version and gone with the next, the
change is in that package's commits: a find-fix commit bisect (`--axis PACKAGE --source
git`) between the two versions' tags, in a clone named by DISTCI_GIT_<PACKAGE> (tags
`v<version>`), over the audit's env of that torch with the newer package (the candidate
commit's package shadows it). Without a clone the row says what to set.

`nox -s fixes_audit -- --bisect` runs it after the audit and writes its table next to
the audit's (and into --report).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from distci.errors import DistciError

COMPARE = "https://github.com/pytorch/{repo}/compare/v{old}...v{new}"
COMMIT = "https://github.com/pytorch/{repo}/commit/{sha}"
REPOS = {"torch": "pytorch", "torchao": "ao", "torchtitan": "torchtitan"}
Log = Callable[[str], None]


@dataclass(frozen=True)
class FixChange:
    """Where an audited fix's bug disappears: present at `last_present`, gone from
    `first_absent` (the next audited version) on."""

    fix: str
    test: str
    last_present: str
    first_absent: str
    axis: str = "torch"
    torch: str = ""
    """For a package axis: the torch both package versions were audited on."""


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
        repo = REPOS.get(self.change.axis, self.change.axis)
        if self.first_good and re.fullmatch(r"[0-9a-f]{7,40}", self.first_good):
            return COMMIT.format(repo=repo, sha=self.first_good)
        old = self.change.last_present if not self.first_good else _previous(self)
        return COMPARE.format(repo=repo, old=old, new=self.first_good or self.change.first_absent)


def changes(rows: Sequence[Any]) -> list[FixChange]:
    """From audit rows (fix, torch, test, off.outcome), each fix's last present -> first
    absent pair, where the bug is gone from then on (the audit's `obsolete since`)."""
    from packaging.version import Version

    by_fix: dict[tuple[str, str], list[Any]] = {}
    by_torch: dict[tuple[str, str], list[Any]] = {}
    for row in rows:
        by_fix.setdefault((row.fix, getattr(row, "package", "")), []).append(row)
        if getattr(row, "package", ""):
            by_torch.setdefault((row.fix, row.torch), []).append(row)
    found = []
    for (fix, _), fix_rows in sorted(by_fix.items()):
        fix_rows.sort(key=lambda r: Version(r.torch))
        pair = _last_present_then_absent(fix_rows)
        if pair:
            found.append(FixChange(fix, pair[1].test, pair[0].torch, pair[1].torch))
    seen = set()
    for (fix, torch), torch_rows in sorted(by_torch.items(), key=lambda kv: (kv[0][0], Version(kv[0][1]))):
        torch_rows.sort(key=lambda r: Version(r.package.partition("==")[2]))
        pair = _last_present_then_absent(torch_rows)
        if not pair:
            continue
        name, old, new = pair[0].package.partition("==")[0], pair[0].package.partition("==")[2], \
            pair[1].package.partition("==")[2]
        if (fix, name, old, new) not in seen:  # the newest torch where both ran answers for all
            seen.add((fix, name, old, new))
            found.append(FixChange(fix, pair[1].test, old, new, axis=name, torch=torch))
    return found


def _last_present_then_absent(ordered: Sequence[Any]) -> tuple[Any, Any] | None:
    failed = [i for i, r in enumerate(ordered) if r.off.outcome == "failed"]
    if not failed or failed[-1] + 1 >= len(ordered):
        return None
    later = ordered[failed[-1] + 1]
    return (ordered[failed[-1]], later) if later.off.outcome == "passed" else None


def bisect_audit(rows: Sequence[Any], *, out: Path, log: Log = print, extra: Sequence[str] = (),
                 package_env: Callable[[FixChange], Path] | None = None) -> list[FixBisect]:
    """A find-fix bisect over the torch releases (or, for a package's change, that
    package's commits) of each obsolete fix's change; `extra` are more `distci bisect`
    options (e.g. --index-url, --find-links); `package_env` names the audit's env a
    package change's commits are probed over."""
    import os

    from distci.bisect.args import BisectArgs
    from distci.bisect.command import main
    from distci.provision.sources import env_var_name

    answers = []
    for change in changes(rows):
        report = out / "bisect" / f"{change.fix}{'+' + change.axis if change.axis != 'torch' else ''}.json"
        if change.axis == "torch":
            log(f"fix {change.fix}: bug present on {change.last_present}, gone on {change.first_absent}: "
                "bisecting the releases between them")
            args = BisectArgs(test_id=change.test, axis="torch", source="release", find_fix=True,
                              bad=change.last_present, good=change.first_absent, report=str(report),
                              out=str(out / "bisect"))
        else:
            var = env_var_name("DISTCI_GIT_", change.axis)
            repo = os.environ.get(var, "")
            log(f"fix {change.fix}: bug present with {change.axis} {change.last_present}, gone with "
                f"{change.first_absent} (torch {change.torch}): bisecting {change.axis}'s commits")
            if not repo or package_env is None:
                answers.append(FixBisect(change, "not run", reason=f"set {var} to a clone of {change.axis} "
                                         f"(with tags v{change.last_present}, v{change.first_absent})"))
                continue
            args = BisectArgs(test_id=change.test, axis=change.axis, source="git", find_fix=True, repo=repo,
                              bad=f"v{change.last_present}", good=f"v{change.first_absent}", report=str(report),
                              out=str(out / "bisect"), base_env=str(package_env(change)))
        for option in _pairs(extra):
            setattr(args, *option)
        try:
            main(args, log=log)
        except DistciError as exc:
            answers.append(FixBisect(change, "error", reason=str(exc), report=str(report)))
            continue
        import json

        data = json.loads(report.read_text())
        answers.append(FixBisect(change, data["kind"], first_good=_version_of(data.get("first_good")),
                                 probes=data.get("distinct_probes", 0), report=str(report),
                                 reason=data.get("reason", "")))
    return answers


def to_markdown(answers: Sequence[FixBisect]) -> str:
    lines = ["## Obsolete since which upstream change", "",
             "| fix | axis | bug present | gone | first good (bisect) | probes | change |",
             "|---|---|---|---|---|---:|---|"]
    for a in answers:
        landed = a.first_good or (f"{a.status}: {a.reason}" if a.reason else a.status)
        axis = a.change.axis if a.change.axis == "torch" else f"{a.change.axis} (torch {a.change.torch})"
        lines.append(f"| `{a.change.fix}` | {axis} | {a.change.last_present} | {a.change.first_absent} | "
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
    return _version_of(data.get("last_bad")) or answer.change.last_present


def _version_of(key: str | None) -> str:
    """A candidate key as the table shows it: `torch==2.6.0` -> 2.6.0, `torchtitan@<sha>` -> the sha."""
    return (key or "").split("==")[-1].split("@")[-1]


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
