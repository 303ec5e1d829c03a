"""The two stories a night's results tell: what broke (one card per bug) and what the fixes hide.

A single upstream break fails many tests in many cells; each failure has the same error
signature. `break_cards` makes one card per signature (cells, tests, the first bad run
and the last good one before it, the stack diff between them and the upstream compare
range), with the individual tests folded inside, instead of one card per test and cell.

A `fix_off` cell is the twin of a `fix_on` cell: same stack, fix package disabled. Its
failures are the upstream bugs the fix package hides in the `fix_on` cell, often known
issues (xfail), so the twin looks green. `fix_stories` says it outright per pair.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from distci.dashboard.links import Link, compare_links, repro_lines, web_url
from distci.judge.history import FAILING, PASSING, first_bad, stack_diff, test_history
from distci.judge.store import Store
from distci.judge.rows import ResultRow, RunRow, is_environment
from distci.judge.verdicts import SEVERITY, worst
from distci.provision.sources import IndexConfig


@dataclass
class BreakCard:
    signature: str
    verdict: str
    items: list[ResultRow]
    first_bad: RunRow | None
    last_good: RunRow | None
    diff: list[tuple[str, str, str]]
    compare: list[Link]
    issue: Link | None
    repro: list[str]
    known_issue: str | None

    @property
    def cells(self) -> list[str]:
        return sorted({r.cell_id for r in self.items})

    @property
    def tests(self) -> list[str]:
        return sorted({r.test_id for r in self.items}, key=natural_key)

    @property
    def by_test(self) -> list[tuple[str, list[ResultRow]]]:
        """Each failing test once, in natural order, with its results (a cell each): the card
        lists tests, not test x cell, so a break across 50 cells stays one line per test."""
        groups: dict[str, list[ResultRow]] = defaultdict(list)
        for r in self.items:
            groups[r.test_id].append(r)
        return [(t, groups[t]) for t in self.tests]

    @property
    def anchor(self) -> str:
        return card_anchor(self.signature)


@dataclass
class FixStory:
    on_cell: str
    off_cell: str
    hidden: list[ResultRow]
    known_issues: list[str]
    fixes: list[str]
    signatures: list[str] = field(default_factory=list)

    @property
    def bugs(self) -> int:
        """Distinct upstream bugs: a known issue each, plus each unexplained signature."""
        unexplained = {r.error_signature or r.test_id for r in self.hidden if not r.known_issue}
        return len(self.known_issues) + len(unexplained)


def natural_key(text: str) -> list[Any]:
    """Sorts `t[2]` before `t[19]` (numbers by value): re.split with a group alternates
    text and digit runs, so equal positions always hold the same type."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text))]


def card_anchor(signature: str) -> str:
    """The id of a signature's card on the page (the release view links to it)."""
    return "break-" + hashlib.sha1(signature.encode()).hexdigest()[:12]


class _History:
    """The runs and each failing test's history, read from the store as first_bad walks back."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._runs: dict[str, RunRow] = {r.run_id: r for r in store.runs()}

    def run(self, run_id: str | None) -> RunRow | None:
        return self._runs.get(run_id) if run_id else None

    def first_bad(self, r: ResultRow) -> tuple[RunRow | None, RunRow | None]:
        """The run where this failure began (same signature, unbroken) and the pass before it
        (distci.judge.history.first_bad, walking the test's history newest first)."""
        first, good = first_bad(test_history(self.store, r.cell_id, r.test_id), r)
        return self.run(first.run_id), self.run(good.run_id) if good else None


def break_cards(store: Store, latest: Mapping[str, list[ResultRow]], *, issues: Mapping[str, str] | None = None,
                index: IndexConfig | None = None) -> list[BreakCard]:
    """One card per error signature of the failures in the latest runs, infra ones included
    (a cell whose environment never came up is the release view's, not a card)."""
    groups: dict[str, list[ResultRow]] = defaultdict(list)
    for rows in latest.values():
        for r in rows:
            if (r.verdict in FAILING or r.verdict == "infra") and not is_environment(r.test_id):
                groups[r.error_signature or r.verdict_reason or r.verdict].append(r)
    history = _History(store)
    cards = []
    for signature, items in groups.items():
        firsts = [(history.first_bad(r), r) for r in items]
        (first_bad, last_good), sample = min(
            firsts, key=lambda f: (f[0][0].started_at if f[0][0] else "~", f[1].cell_id, f[1].test_id))
        diff = stack_diff(last_good.stack, first_bad.stack) if first_bad and last_good else []
        compare = compare_links(last_good.stack, first_bad.stack) if first_bad and last_good else []
        url = web_url((issues or {}).get(signature))
        latest_run = history.run(sample.run_id)
        known = next((r.known_issue for r in items if r.known_issue), None)
        cards.append(BreakCard(
            signature=signature,
            verdict=worst(r.verdict for r in items) or "",
            items=sorted(items, key=lambda r: (r.cell_id, natural_key(r.test_id))),
            first_bad=first_bad,
            last_good=last_good,
            diff=diff,
            compare=compare,
            issue=Link("filed issue", url) if url else None,
            repro=repro_lines(latest_run, sample.test_id, index=index) if latest_run else [],
            known_issue=known,
        ))
    cards.sort(key=lambda c: (SEVERITY.get(c.verdict, 99), -len(c.items), c.signature))
    return cards


def twin_of(cell_id: str) -> str | None:
    """The fix_on cell a fix_off cell mirrors (ids differ only in that last axis)."""
    return cell_id[: -len("fix_off")] + "fix_on" if cell_id.endswith("fix_off") else None


def fix_stories(latest_runs: Mapping[str, RunRow], latest: Mapping[str, list[ResultRow]],
                fix_labels: Iterable[str] | None = None) -> list[FixStory]:
    """For each fix_on/fix_off pair: the tests that pass with the fixes and fail without."""
    stories = []
    for off in sorted(latest_runs):
        on = twin_of(off)
        if on is None or on not in latest_runs:
            continue
        on_verdicts = {r.test_id: r.verdict for r in latest[on]}
        hidden = [r for r in latest[off] if r.verdict in FAILING and on_verdicts.get(r.test_id) in PASSING]
        fixes = _applied_fixes(latest_runs[on].stack.fixes)
        stories.append(FixStory(
            on_cell=on,
            off_cell=off,
            hidden=sorted(hidden, key=lambda r: natural_key(r.test_id)),
            known_issues=sorted({r.known_issue for r in hidden if r.known_issue}),
            fixes=fixes,
            signatures=sorted({r.error_signature for r in hidden if r.error_signature}),
        ))
    return stories


def _applied_fixes(fixes: Any) -> list[str]:
    """The ids of the fixes a stack says were applied (names only, whatever the shape)."""
    if isinstance(fixes, dict):
        items = fixes.get("fixes", fixes)
        if isinstance(items, dict):
            return sorted(k for k, v in items.items() if not isinstance(v, dict) or v.get("status") in (None, "applied"))
        fixes = items
    out = []
    for f in fixes or []:
        if isinstance(f, dict):
            if f.get("status") in (None, "applied"):
                out.append(str(f.get("id") or f.get("name")))
        else:
            out.append(str(f))
    return sorted(out)
