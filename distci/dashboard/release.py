"""The release view: per tier, the gate's answer and what stands between it and PASSED.

The dashboard never judges a release itself: `gate.evaluate` does (expected cells from
matrix.toml, states missing / stale / infra_only / in_flight, blocking tests), and this
module only arranges its answer for the page. `_evaluate` is the one place that calls
the gate, so a change of the gate's API touches one function here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from distci.results import format_duration
from distci.judge.store import Store

# The order a release manager reads tiers in; tiers matrix.toml adds come after.
TIER_ORDER = ("release", "pr", "nightly")
STATE_LABELS = {
    "ok": "ok",
    "missing": "missing: never ran",
    "stale": "stale",
    "infra_only": "infra only: no test ran",
    "in_flight": "in flight",
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
class TierView:
    tier: str
    description: str
    status: str
    blocking_suites: list[str] | None
    blocking: list[Any] = field(default_factory=list)
    cells: list[CellLine] = field(default_factory=list)

    def having(self, state: str) -> list[CellLine]:
        return [c for c in self.cells if c.state == state]

    @property
    def not_ok(self) -> list[CellLine]:
        return [c for c in self.cells if c.state not in ("ok", "waived")]


def age_text(age_s: float | None) -> str:
    return "never" if age_s is None else format_duration(age_s) + " ago"


def release_views(store: Store, matrix_path: Path | None, now: datetime | None = None) -> list[TierView]:
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
                              list(result.blocking), cells))
    return views
