"""What the dashboard shows, computed from the store: plain dataclasses a template reads.

Everything a person decides from lives here (which cells are red, what changed since
the previous run, what is flaky); the template only lays it out.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from distci.dashboard.heat import HeatRow, WeekView, cell_status, green_rate, heat_rows, verdict_counts, weeks
from distci.dashboard.links import Link, page_file, run_links, web_url
from distci.dashboard.release import TierView, age_text, release_views
from distci.dashboard.story import BreakCard, FixStory, break_cards, fix_stories, natural_key
from distci.judge.ingest import read_fix_audit
from distci.judge.store import Store
from distci.judge.rows import BisectRow, ResultRow, RunRow, is_environment
from distci.judge.verdicts import SEVERITY, worst
from distci.provision.sources import IndexConfig
from distci.stack import Stack

STACK_KEYS = (
    "torch",
    "torch_git",
    "torchao",
    "torchtitan",
    "torch_npu",
    "triton",
    "python",
    "cuda",
    "nccl",
    "cann",
    "driver",
    "device_name",
    "device_count",
    "device_capability",
    "image_digest",
    "fixes_mode",
)
ALWAYS_SHOW_TESTS = 40


@dataclass
class GridCell:
    suite: str
    verdict: str | None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.verdict is None:
            return "—"
        judged = sum(n for v, n in self.counts.items() if v not in ("skip", "infra"))
        ok = sum(n for v, n in self.counts.items() if v in ("pass", "fixed", "flaky"))
        known = self.counts.get("xfail", 0)
        if not judged:
            return self.verdict
        return f"{ok}/{judged}" + (f" · {known} known" if known else "")

    @property
    def title(self) -> str:
        return ", ".join(f"{n} {v}" for v, n in sorted(self.counts.items(), key=lambda kv: SEVERITY.get(kv[0], 99)))


@dataclass(frozen=True)
class Mark:
    """One square of a history grid: a test's verdict in one run (a light row: a cell's
    page draws thousands of them)."""

    run_id: str
    verdict: str
    error_signature: str | None


@dataclass
class HistoryRow:
    test_id: str
    marks: list[Mark | None]
    latest: str | None


@dataclass
class CellView:
    cell_id: str
    run: RunRow
    status: str
    grid: list[GridCell]
    counts: dict[str, int]
    stack: list[tuple[str, str]]
    fixes: list[str]
    packages: dict[str, str]
    history_runs: list[RunRow]
    history: list[HistoryRow]
    history_hidden: int
    rates: list[float | None]
    environment_failure: ResultRow | None
    age: str = ""
    state: str = "ok"  # the gate's word for the cell (ok, stale, in_flight, infra_only, ...)
    links: list[Link] = field(default_factory=list)
    hides: int = 0  # upstream bugs the fix package hides here (a fix_off twin's failures)

    @property
    def file(self) -> str:
        return page_file("cell", self.cell_id)


@dataclass
class Change:
    """A regression or a fix in a cell's latest run, against the run it was compared with."""

    result: ResultRow
    run: RunRow
    compared: RunRow | None


@dataclass
class FlakyTest:
    test_id: str
    cells: list[str]
    occurrences: int
    last_night: str
    reason: str


@dataclass
class AuditLine:
    """One row of the fix audit page: a fix on one torch version, off vs on."""

    fix: str
    version: str
    present: str
    applied: str
    off: str
    on: str
    verdict: str
    message: str = ""
    cell_id: str = ""


@dataclass
class Page:
    title: str
    generated_at: str
    cells: list[CellView]
    suites: list[str]
    changes: list[Change]
    flaky: list[FlakyTest]
    nights: list[str]
    night_rates: dict[str, list[float | None]]
    night_counts: list[dict[str, int]]
    audit: list[AuditLine]
    bisects: list[BisectRow]
    totals: dict[str, int]
    tiers: list[TierView] = field(default_factory=list)
    cards: list[BreakCard] = field(default_factory=list)
    stories: list[FixStory] = field(default_factory=list)
    heat: list[HeatRow] = field(default_factory=list)
    audit_source: str = ""
    weeks: list[WeekView] = field(default_factory=list)  # newest first
    upstream: dict[str, str] = field(default_factory=dict)  # known issue id -> its upstream http(s) link

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.result.verdict == "regression"]

    @property
    def fixes(self) -> list[Change]:
        return [c for c in self.changes if c.result.verdict == "fixed"]


def _is_test(test_id: str) -> bool:
    return not is_environment(test_id)


def _fix_labels(fixes: Any) -> list[str]:
    """The fixes a stack lists, whatever shape the fix package reports them in."""
    if not fixes:
        return []
    if isinstance(fixes, dict):
        items = fixes.get("fixes", fixes) if isinstance(fixes.get("fixes"), (list, dict)) else fixes
        if isinstance(items, dict):
            return [
                k if not isinstance(v, (str, dict)) else f"{k}: {v if isinstance(v, str) else _status(v)}"
                for k, v in sorted(items.items())
            ]
        fixes = items
    out = []
    for f in fixes:
        if isinstance(f, dict):
            name = f.get("id") or f.get("name") or "?"
            out.append(f"{name}: {_status(f)}" if _status(f) else str(name))
        else:
            out.append(str(f))
    return out


def _status(d: dict[str, Any]) -> str:
    return str(d.get("status") or d.get("state") or "")


def _packages(packages: Any) -> dict[str, str]:
    """Stack.packages: `name==version` strings (distci.stack) or a name -> version map."""
    if isinstance(packages, dict):
        return {str(k): str(v) for k, v in sorted(packages.items())}
    out = {}
    for p in packages or []:
        name, _, version = str(p).partition("==")
        out[name] = version
    return dict(sorted(out.items()))


def _stack_items(stack: Stack) -> list[tuple[str, str]]:
    items = [(k, str(stack.get(k))) for k in STACK_KEYS if stack.get(k) not in (None, "", [])]
    known = set(STACK_KEYS) | {"fixes", "packages"}
    written = stack.to_dict()
    for k in sorted(written):
        v = written[k]
        if k not in known and isinstance(v, (str, int, float, bool)) and v not in ("", None):
            items.append((k, str(v)))
    return items


def history_marks(store: Store, run_ids: list[str]) -> list[tuple[str, str, str, str | None]]:
    """(test_id, run_id, verdict, error_signature) of every result of these runs: what a
    history grid draws, without building a ResultRow per square."""
    out: list[tuple[str, str, str, str | None]] = []
    for i in range(0, len(run_ids), 500):
        chunk = run_ids[i:i + 500]
        out += [tuple(r) for r in store.conn.execute(
            f"SELECT test_id, run_id, verdict, error_signature FROM results WHERE run_id IN "
            f"({','.join('?' * len(chunk))})", chunk)]
    return out


def _cell_view(store: Store, run: RunRow, latest: list[ResultRow], runs: list[RunRow], suites: list[str],
               history_runs: int) -> CellView:
    """A cell's latest run (`latest`) and the history of its last `history_runs` runs of `runs`."""
    by_suite: dict[str, list[str]] = defaultdict(list)
    for r in latest:
        if _is_test(r.test_id):
            by_suite[r.suite].append(r.verdict)
    env_fail = next((r for r in latest if not _is_test(r.test_id) and r.verdict == "infra"), None)
    grid = []
    for s in suites:
        vs = by_suite.get(s, [])
        counts: dict[str, int] = defaultdict(int)
        for v in vs:
            counts[v] += 1
        verdict = worst(vs) or ("infra" if env_fail else None)
        grid.append(GridCell(s, verdict, dict(counts) if vs else ({"infra": 1} if env_fail else {})))
    counts: dict[str, int] = defaultdict(int)
    for r in latest:
        counts[r.verdict] += 1

    shown = runs[-history_runs:]
    marks: dict[str, dict[str, Mark]] = defaultdict(dict)
    by_run: dict[str, list[str]] = defaultdict(list)
    for test_id, run_id, verdict, signature in history_marks(store, [x.run_id for x in shown]):
        marks[test_id][run_id] = Mark(run_id, verdict, signature)
        by_run[run_id].append(verdict)
    rows = []
    for test_id in sorted(marks, key=lambda t: (not _is_test(t), natural_key(t))):
        row = [marks[test_id].get(x.run_id) for x in shown]
        last = marks[test_id].get(run.run_id)
        rows.append(HistoryRow(test_id, row, last.verdict if last else None))
    hidden = 0
    if len(rows) > ALWAYS_SHOW_TESTS:
        quiet = [h for h in rows if all(m is None or m.verdict in ("pass", "skip") for m in h.marks)]
        hidden = len(quiet)
        rows = [h for h in rows if h not in quiet]
    rows.sort(key=lambda h: (SEVERITY.get(h.latest or "", 99), natural_key(h.test_id)))
    return CellView(
        cell_id=run.cell_id,
        run=run,
        status=cell_status([r.verdict for r in latest]),
        grid=grid,
        counts=dict(counts),
        stack=_stack_items(run.stack),
        fixes=_fix_labels(run.stack.fixes),
        packages=_packages(run.stack.packages),
        history_runs=shown,
        history=rows,
        history_hidden=hidden,
        rates=[green_rate(by_run.get(x.run_id, [])) for x in shown],
        environment_failure=env_fail,
    )


def _flaky(store: Store, nights: list[str], all_runs: list[RunRow]) -> list[FlakyTest]:
    window = set(nights)
    runs = {r.run_id: r for r in all_runs}
    found: dict[str, list[ResultRow]] = defaultdict(list)
    for r in store.results(verdicts=["flaky"]):
        if runs[r.run_id].night in window:
            found[r.test_id].append(r)
    out = [
        FlakyTest(
            test_id=t,
            cells=sorted({r.cell_id for r in rs}),
            occurrences=len(rs),
            last_night=max(runs[r.run_id].night for r in rs),
            reason=rs[-1].verdict_reason,
        )
        for t, rs in found.items()
    ]
    return sorted(out, key=lambda f: (-f.occurrences, natural_key(f.test_id)))


def _audit_lines(store: Store, audit_dir: Path | None) -> tuple[list[AuditLine], str]:
    """The latest fix audit: the newest `audit.json` under audit_dir (as `distci audit`
    writes it, read by audit_report.reload), else the rows indexed in the store."""
    if audit_dir is not None and Path(audit_dir).is_dir():
        found = sorted(Path(audit_dir).glob("*/audit.json")) + sorted(Path(audit_dir).glob("audit.json"))
        for path in reversed(found):
            try:
                from distci.audit.report import reload

                audit = reload(path.parent)
            except (OSError, ValueError, TypeError, KeyError):
                continue
            lines = [AuditLine(r.fix, r.torch, _yes_no(r.present), r.status, _run_text(r.off), _run_text(r.on),
                               r.verdict, r.off.message if r.off.outcome == "failed" else "") for r in audit.rows]
            return lines, f"{path.parent.name} ({', '.join(audit.versions)})"
        rows = [row for p in sorted(Path(audit_dir).glob("*.json")) for row in read_fix_audit(p)]
        if rows:
            return [AuditLine(a.fix, a.version, a.present or "–", a.applied or "–", a.off or "–", a.on or "–",
                              a.verdict or "–", cell_id=a.cell_id) for a in rows], str(audit_dir)
    rows = store.fix_audit()
    return [AuditLine(a.fix, a.version, a.present or "–", a.applied or "–", a.off or "–", a.on or "–",
                      a.verdict or "–", cell_id=a.cell_id) for a in rows], ("the store" if rows else "")


def _yes_no(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "?"}[value]


def _run_text(run: Any) -> str:
    total = run.passed + run.failed + run.skipped
    return f"{run.outcome} ({run.passed}/{total})" if run.outcome in ("passed", "failed") else run.outcome


def build_page(store: Store, *, title: str = "distci", audit_dir: Path | None = None, history_runs: int = 14,
               matrix_path: Path | None = None, now: datetime | None = None, site: Path | None = None,
               issues: dict[str, str] | None = None, known_issues: Path | None = None,
               index: IndexConfig | None = None) -> Page:
    """Everything the page shows. `matrix_path` enables the release view (the gate per
    tier); `site` is where the page is written (the run files it links are published
    there); `issues` maps an error signature to the issue filed for it; `known_issues` is
    the registry whose upstream links the known-issue chips take; `index` the package
    indexes pinned repro lines name (default: the DISTCI_* index variables)."""
    now = now or datetime.now(timezone.utc)
    upstream = upstream_links(known_issues)
    all_runs = store.runs()
    runs_of: dict[str, list[RunRow]] = defaultdict(list)
    for run in all_runs:
        runs_of[run.cell_id].append(run)
    latest = {cell: runs[-1] for cell, runs in sorted(runs_of.items())}
    latest_results = {c: judged_results(store, c, runs_of[c], now) for c in latest}
    suites = sorted({r.suite for rs in latest_results.values() for r in rs if _is_test(r.test_id)})
    tiers = release_views(store, matrix_path, now, issues=issues, index=index)
    states = {c.cell_id: c.state for t in reversed(tiers) for c in t.cells}
    stories = fix_stories(latest, latest_results)
    hides = {s.off_cell: s.bugs for s in stories}
    cells = [_cell_view(store, run, latest_results[c], runs_of[c], suites, history_runs) for c, run in latest.items()]
    for c in cells:
        started = _parse(c.run.started_at)
        c.age = age_text((now - started).total_seconds() if started else None)
        c.state = states.get(c.cell_id, "ok" if c.run.ended_at else "in_flight")
        c.links = run_links(c.run, site)
        c.hides = hides.get(c.cell_id, 0)
    order = {"red": 0, "amber": 1, "infra": 2, "green": 3, "none": 4}
    cells.sort(key=lambda c: (order[c.status], c.cell_id))

    changes = []
    run_of = {r.run_id: r for r in all_runs}
    for cell in latest:
        for r in latest_results[cell]:
            if r.verdict in ("regression", "fixed"):
                changes.append(Change(r, run_of[r.run_id], store.run(r.compared_run) if r.compared_run else None))
    changes.sort(key=lambda c: (c.result.verdict != "regression", c.result.cell_id, natural_key(c.result.test_id)))


    nights = sorted({r.night for r in all_runs if r.night})[-history_runs:]
    window = [r for r in all_runs if r.night in nights]
    counts_by_run = verdict_counts(store)
    night_rates: dict[str, list[float | None]] = {}
    per_night: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
    for run in window:
        into = per_night[run.cell_id].setdefault(run.night, {})
        for v, n in counts_by_run.get(run.run_id, {}).items():
            into[v] = into.get(v, 0) + n
    for cell in sorted(per_night):
        night_rates[cell] = [green_rate(per_night[cell][n]) if n in per_night[cell] else None for n in nights]
    night_counts = []
    for n in nights:
        counts: dict[str, int] = defaultdict(int)
        for cell in per_night:
            for v, k in per_night[cell].get(n, {}).items():
                counts[v] += k
        night_counts.append(dict(counts))

    totals: dict[str, int] = defaultdict(int)
    for rs in latest_results.values():
        for r in rs:
            totals[r.verdict] += 1
    audit, audit_source = _audit_lines(store, audit_dir)
    return Page(
        title=title,
        generated_at=now.strftime("%Y-%m-%d %H:%M UTC"),
        cells=cells,
        suites=suites,
        changes=changes,
        flaky=_flaky(store, nights, all_runs),
        nights=nights,
        night_rates=night_rates,
        night_counts=night_counts,
        audit=audit,
        bisects=store.bisects(),
        totals=dict(totals),
        tiers=tiers,
        cards=break_cards(store, latest_results, issues=issues, index=index),
        stories=stories,
        heat=heat_rows(sorted(latest), nights, window, counts_by_run),
        audit_source=audit_source,
        weeks=weeks(sorted(latest), all_runs, counts_by_run),
        upstream=upstream,
    )


def judged_results(store: Store, cell: str, runs: list[RunRow], now: datetime) -> list[ResultRow]:
    """The results the gate judges `cell` by (distci.judge.coverage.judge_cell): each test's
    latest since the cell's latest complete run, so a narrowed rerun adds evidence and never
    replaces the complete run on any card. The tier is the newest one a run of it declared."""
    from distci.judge.coverage import judge_cell

    tier = next((r.tier for r in reversed(runs) if r.tier), "")
    return judge_cell(store, cell, tier, now=now)[1]


def upstream_links(registry: Path | None) -> dict[str, str]:
    """Known issue id -> its upstream link (http(s) only) from the registry; none without one."""
    if registry is None or not Path(registry).is_file():
        return {}
    from distci.judge.runreader import load_known_issues

    return {e.id: url for e in load_known_issues(Path(registry)).entries if (url := web_url(e.upstream))}


def _parse(ts: str) -> datetime | None:
    try:
        dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def page_json(page: Page) -> str:
    """A machine-readable summary written next to index.html (data.json)."""
    return json.dumps(
        {
            "generated_at": page.generated_at,
            "cells": {c.cell_id: {"status": c.status, "run_id": c.run.run_id, "counts": c.counts} for c in page.cells},
            "regressions": [
                {"cell": c.result.cell_id, "test": c.result.test_id, "signature": c.result.error_signature}
                for c in page.regressions
            ],
            "flaky": [f.test_id for f in page.flaky],
            "gate": {t.tier: {"status": t.status, "blocking": len(t.blocking),
                              "cells": {c.cell_id: c.state for c in t.cells}} for t in page.tiers},
            "breaks": [{"signature": c.signature, "cells": c.cells, "tests": len(c.tests)} for c in page.cards],
            "fix_story": [{"on": s.on_cell, "off": s.off_cell, "bugs": s.bugs, "known_issues": s.known_issues}
                          for s in page.stories],
        },
        indent=1,
        sort_keys=True,
    )
