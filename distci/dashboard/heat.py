"""The nights as a heat map: each cell's worst verdict and green rate per night.

The index shows the last nights; every week of the history gets its own page
(week-<YYYY-Www>.html), so a year is 52 small pages, not one page a year long. Verdicts
come in as counts per run (verdict_counts: one pass over the results table),
never as a row per result.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from distci.dashboard.links import page_file
from distci.judge.rows import RunRow
from distci.judge.store import Store
from distci.judge.verdicts import BLOCKING, worst


def cell_status(verdicts: list[str]) -> str:
    """A cell's colour: red only for regression/fail (rule 4: infra never turns it red)."""
    if any(v in BLOCKING for v in verdicts):
        return "red"
    if "flaky" in verdicts:
        return "amber"
    if "infra" in verdicts:
        return "infra"
    if any(v in ("pass", "fixed", "xfail") for v in verdicts):
        return "green"
    return "none"


def green_rate(verdicts: list[str] | dict[str, int]) -> float | None:
    """Percent of judged tests (not skipped, not infra) that are not failing; `verdicts`
    as a list, or as counts (verdict -> how many) for a year of runs."""
    counts = verdicts if isinstance(verdicts, dict) else {v: verdicts.count(v) for v in set(verdicts)}
    judged = sum(n for v, n in counts.items() if v not in ("skip", "infra"))
    if not judged:
        return None
    return 100.0 * sum(n for v, n in counts.items() if v not in ("skip", "infra") and v not in BLOCKING) / judged


@dataclass
class HeatRow:
    """One cell's nights: the worst verdict of each (None: no run that night) and its rate."""

    cell_id: str
    marks: list[tuple[str, str | None, float | None]]


@dataclass
class WeekView:
    """One ISO week of nights: the heat of every cell, on its own page (week-<label>.html),
    so a year of history is 52 small pages, not one page a year long."""

    label: str  # 2026-W48
    nights: list[str]
    heat: list[HeatRow]
    counts: dict[str, int]

    @property
    def file(self) -> str:
        return page_file("week", self.label)

    @property
    def status(self) -> str:
        return cell_status(list(self.counts))


def verdict_counts(store: Store) -> dict[str, dict[str, int]]:
    """run_id -> {verdict: how many}, for every run: one pass over the results table, by the
    covering index results_by_run_verdict."""
    out: dict[str, dict[str, int]] = {}
    for run_id, verdict, n in store.conn.execute(
            "SELECT run_id, verdict, COUNT(*) FROM results GROUP BY run_id, verdict"):
        out.setdefault(run_id, {})[verdict] = n
    return out


def heat_rows(cells: list[str], nights: list[str], window: list[RunRow],
          counts_by_run: dict[str, dict[str, int]]) -> list[HeatRow]:
    by_cell_night: dict[tuple[str, str], dict[str, int]] = {}
    for run in window:
        into = by_cell_night.setdefault((run.cell_id, run.night), {})
        for v, n in counts_by_run.get(run.run_id, {}).items():
            into[v] = into.get(v, 0) + n
    rows = []
    for cell in cells:
        marks = []
        for n in nights:
            vs = by_cell_night.get((cell, n))
            marks.append((n, (worst(vs) or "none") if vs is not None else None, green_rate(vs) if vs else None))
        rows.append(HeatRow(cell, marks))
    return rows


def iso_week(night: str) -> str:
    """`2026-11-30` -> `2026-W49`: the week a night's page is in."""
    try:
        year, week, _ = datetime.fromisoformat(night[:10]).isocalendar()
    except ValueError:
        return "undated"
    return f"{year}-W{week:02d}"


def weeks(cells: list[str], all_runs: list[RunRow], counts_by_run: dict[str, dict[str, int]]) -> list[WeekView]:
    """Every week of the history, newest first: the split pages of a year."""
    by_week: dict[str, list[RunRow]] = defaultdict(list)
    for run in all_runs:
        if run.night:
            by_week[iso_week(run.night)].append(run)
    weeks = []
    for label in sorted(by_week, reverse=True):
        runs = by_week[label]
        nights = sorted({r.night for r in runs})
        counts: dict[str, int] = defaultdict(int)
        for r in runs:
            for v, n in counts_by_run.get(r.run_id, {}).items():
                counts[v] += n
        weeks.append(WeekView(label, nights, heat_rows(cells, nights, runs, counts_by_run), dict(counts)))
    return weeks
