"""The release view: per tier, the gate's answer and what stands between it and PASSED.

The dashboard never judges a release itself: `gate.evaluate` does (expected cells from
matrix.toml, states missing / stale / infra_only / in_flight, blocking tests), and this
module only arranges its answer for the page. `_evaluate` is the one place that calls
the gate, so a change of the gate's API touches one function here.

Each blocking test says what a release manager acts on (`Blocker`): since when it fails
(its first bad run and that run's night, distci.judge.history), what changed from the last
good run (the stack diff, upstream compare links), and what to do (pasteable repro lines,
the filed issue, the bisect that ran for it, the card that groups it with the rest of its
break).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from distci.dashboard.links import Link, repro_lines, web_url
from distci.dashboard.story import card_anchor
from distci.judge.history import Onset, onset
from distci.judge.store import Store
from distci.judge.rows import BisectRow
from distci.provision.sources import IndexConfig
from distci.results import format_duration

MAX_EXPLAINED = 30  # blockers shown one by one; the rest are grouped under Breaks

# The order a release manager reads tiers in; tiers matrix.toml adds come after.
TIER_ORDER = ("release", "pr", "nightly")
STATE_LABELS = {
    "ok": "ok",
    "missing": "missing: never ran",
    "stale": "stale",
    "infra_only": "infra only: no test ran",
    "in_flight": "in flight",
    "partial": "partial: expected tests without a result",
    "waived": "waived",
}


def _evaluate(store: Store, tier: str, matrix_path: Path, now: datetime) -> Any:
    from distci.judge.gate import evaluate

    return evaluate(store, tier, matrix_path=matrix_path, now=now)


@dataclass
class CellLine:
    """One expected cell of a tier, as the release view shows it."""

    cell_id: str
    state: str
    age: str
    reason: str
    run_id: str | None
    torch: str | None

    @property
    def label(self) -> str:
        return STATE_LABELS.get(self.state, self.state)


@dataclass
class Blocker:
    """A blocking test with since when, what changed and what to do."""

    item: Any  # the gate's GateItem
    onset: Onset
    repro: list[str]
    issue: Link | None
    bisect: BisectRow | None
    card: str  # the id of its break card on the page

    @property
    def since(self) -> str:
        run = self.onset.first_bad
        return run.night if run else ""


@dataclass
class TierView:
    tier: str
    description: str
    status: str
    blocking_suites: list[str] | None
    blocking: list[Any] = field(default_factory=list)
    cells: list[CellLine] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)

    def having(self, state: str) -> list[CellLine]:
        return [c for c in self.cells if c.state == state]

    @property
    def not_ok(self) -> list[CellLine]:
        return [c for c in self.cells if c.state not in ("ok", "waived")]


def age_text(age_s: float | None) -> str:
    return "never" if age_s is None else format_duration(age_s) + " ago"


def explain(store: Store, items: list[Any], *, issues: Mapping[str, str] | None = None,
            index: IndexConfig | None = None) -> list[Blocker]:
    """A Blocker for each of the first MAX_EXPLAINED blocking items."""
    runs = {r.run_id: r for r in store.runs()}
    bisects = store.bisects()
    out = []
    for item in items[:MAX_EXPLAINED]:
        result = store.result(item.run_id, item.test_id)  # its history is read by onset, as far as it goes
        run = runs.get(item.run_id)
        if result is None or run is None:
            continue
        signature = result.error_signature or result.verdict_reason or result.verdict
        url = web_url((issues or {}).get(signature))
        bisect = next((b for b in reversed(bisects) if b.test_id == item.test_id
                       and b.cell_id in ("", item.cell_id)), None)
        out.append(Blocker(item, onset(store, result, runs=runs),
                           repro_lines(run, item.test_id, index=index), Link("filed issue", url) if url else None,
                           bisect, card_anchor(signature)))
    return out


def release_views(store: Store, matrix_path: Path | None, now: datetime | None = None, *,
                  issues: Mapping[str, str] | None = None, index: IndexConfig | None = None) -> list[TierView]:
    """One TierView per tier of matrix.toml, release first; none without a matrix file."""
    if matrix_path is None or not Path(matrix_path).exists():
        return []
    from distci.matrix import load_matrix

    now = now or datetime.now(timezone.utc)
    matrix = load_matrix(matrix_path)
    names = sorted(matrix.tiers, key=lambda t: (TIER_ORDER.index(t) if t in TIER_ORDER else len(TIER_ORDER), t))
    views = []
    for name in names:
        result = _evaluate(store, name, Path(matrix_path), now)
        cells = [
            CellLine(c.cell_id, c.state, age_text(c.age_s), c.reason, c.last_run.run_id if c.last_run else None,
                     c.torch_version)
            for c in result.cells
        ]
        order = {"missing": 0, "infra_only": 1, "stale": 2, "in_flight": 3, "waived": 4, "ok": 5}
        cells.sort(key=lambda c: (order.get(c.state, 9), c.cell_id))
        views.append(TierView(name, matrix.tiers[name].description, result.status, result.blocking_suites,
                              list(result.blocking), cells, explain(store, list(result.blocking), issues=issues,
                                                                    index=index)))
    return views
