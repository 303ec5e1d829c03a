"""`nox -s bench -- store`: the store, the gate and the dashboard at 1x, 10x and 100x today.

Today is 50 cells x 300 tests for about four nights (~55 k results); 100x is a year of
nightly history (365 nights, ~5.5 M results). For each scale a history is generated
(distci.bench.history) and then, timed with time.perf_counter:

- ingest: the history but its last night, read from its run directories by `ingest_runs`
  (what `distci ingest` runs), BATCH_NIGHTS nights per call (a call streams its runs one
  at a time, oldest first) -> results per second, wall and per CPU second;
- nightly ingest: the last night alone into the full store (what every night pays);
- gate: the release tier (`evaluate`) against the full store;
- dashboard: `render_dashboard` into a fresh directory, and its weight (the index,
  the largest page, the whole site).

Goals at 100x on 2 cores: ingest >= 20 k results/s, gate <= 2 s, dashboard <= 30 s.
The figures and the load average during each scale go to .distci/bench-store.json.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sqlite3
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from distci.bench.history import START, History, Shape, cell_ids, generate, test_ids, write_night

TODAY_NIGHTS = 3.65  # 100x today is a year
SCALES = (1, 10, 100)
BATCH_NIGHTS = 30
GOALS = {"ingest_rate": 20_000.0, "gate_s": 2.0, "dashboard_s": 30.0}
REPO = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = REPO / ".distci" / "bench-store"


@dataclass
class StoreFigures:
    """One scale's measurements (seconds, bytes, results per second)."""

    scale: int
    nights: int
    cells: int
    tests: int
    results: int
    built: str  # "ingested" from generated files, or "grown from <scale>x" in SQL
    generate_s: float
    ingest_s: float
    ingest_rate: float
    ingest_cpu_rate: float  # results per CPU second of this process and its reader: what the code costs, whatever the load
    nightly_ingest_s: float
    gate_s: float
    gate_cpu_s: float
    gate_status: str
    dashboard_s: float
    dashboard_cpu_s: float
    index_bytes: int
    largest_page_bytes: int
    site_bytes: int
    pages: int
    store_bytes: int
    peak_rss_mb: float
    load: tuple[float, float]  # the 1-minute load average before and after the scale

    def goals(self) -> dict[str, bool]:
        """Each goal this scale measured (a grown store measured no ingest rate)."""
        met = {"gate_s": self.gate_s <= GOALS["gate_s"], "dashboard_s": self.dashboard_s <= GOALS["dashboard_s"]}
        if self.ingest_rate:
            met["ingest_rate"] = self.ingest_rate >= GOALS["ingest_rate"]
        return met


def nights_for(scale: int) -> int:
    return max(1, round(TODAY_NIGHTS * scale))


def _cpu_seconds() -> float:
    """User + system seconds of this process and of its ended children (ingest's reader
    process: distci.judge.runreader), so a rate per CPU second leaves no worker out."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(fn):
    """(fn(), wall seconds); the CPU seconds of the last call (its processes' too) are in _timed.cpu."""
    started, cpu = time.perf_counter(), _cpu_seconds()
    value = fn()
    _timed.cpu = _cpu_seconds() - cpu
    return value, time.perf_counter() - started


def grow(store_path: Path, copies: int, nights: int) -> None:
    """Repeats the store's history: `copies` more blocks of its runs and results, block k
    moved k x `nights` days later, run ids prefixed `g<k>-`. Verdicts are copied, not
    recomputed. What the gate and the dashboard read at a year, built in SQL when there is
    no time or disk to ingest a year of files (docs/benchmarks.md says which scales were)."""
    conn = sqlite3.connect(str(store_path), isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        for table in ("runs", "results"):
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            last = conn.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0] or 0  # the rows to repeat
            for k in range(1, copies + 1):
                shift = f"'+{k * nights} days'"
                moved = {
                    "run_id": f"'g{k}-' || run_id",
                    "started_at": f"CASE started_at WHEN '' THEN '' ELSE strftime('%Y-%m-%dT%H:%M:%S', started_at, {shift}) || '+00:00' END",
                    "ended_at": f"CASE ended_at WHEN '' THEN '' ELSE strftime('%Y-%m-%dT%H:%M:%S', ended_at, {shift}) || '+00:00' END",
                    "run_started_at": f"CASE run_started_at WHEN '' THEN '' ELSE strftime('%Y-%m-%dT%H:%M:%S', run_started_at, {shift}) || '+00:00' END",
                    "nightly_date": f"date(nightly_date, {shift})",
                    "compared_run": f"CASE WHEN compared_run IS NULL THEN NULL ELSE 'g{k}-' || compared_run END",
                }
                select = ", ".join(moved.get(c, c) for c in columns)
                conn.execute("BEGIN")
                conn.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM {table} "
                             f"WHERE rowid <= {last}")
                conn.execute("COMMIT")
    finally:
        conn.close()


def _night_after(history: History, night: int, rng_seed: int = 1) -> Path:
    """One more night of every cell, `night` nights after the start: what tonight's ingest reads."""
    import random

    rng = random.Random(rng_seed)
    for offset, cell in enumerate(history.cells):
        write_night(history, night, offset, cell, START + timedelta(days=night, minutes=3 * offset), rng)
    return history.runs / f"n{night:04d}"


def measure(root: Path, scale: int, *, cells: int = 50, tests: int = 300, console: Console | None = None,
            grow_from: "StoreFigures | None" = None, source: Path | None = None) -> StoreFigures:
    """One scale: its history generated and ingested under root (or, given `grow_from` and
    its `source` directory, that scale's store grown in SQL to this one), then tonight's
    ingest, the gate and the dashboard timed on it."""
    from distci.dashboard.render import render_dashboard
    from distci.judge.gate import evaluate
    from distci.judge.ingest import ingest_runs
    from distci.judge.store import Store

    say = console.print if console is not None else (lambda *a: None)
    load_before = os.getloadavg()[0]
    shutil.rmtree(root, ignore_errors=True)
    ingested = 0
    ingest_s = ingest_cpu = generate_s = 0.0
    if grow_from is None:
        shape = Shape(nights=nights_for(scale), cells=cells, tests=tests)
        say(f"store bench {scale}x: generating {shape.nights} nights x {cells} cells x {tests} tests "
            f"({shape.results:,} results)")
        history, generate_s = _timed(lambda: generate(root, shape))
        groups = list(history.night_groups())
        backfill, tonight = groups[:-1], groups[-1]
        with Store(root / "store.sqlite") as store:
            for i in range(0, len(backfill), BATCH_NIGHTS):
                batch = backfill[i:i + BATCH_NIGHTS]
                report, took = _timed(lambda: ingest_runs(store, batch))
                ingested += report.results
                ingest_s += took
                ingest_cpu += _timed.cpu
                say(f"  ingest nights {i + 1}-{i + len(batch)}: {report.results:,} results in {took:.1f}s")
        built = "ingested"
    else:
        copies = max(1, round(nights_for(scale) / grow_from.nights) - 1)
        shape = Shape(nights=grow_from.nights * (copies + 1) + 1, cells=grow_from.cells, tests=grow_from.tests)
        root.mkdir(parents=True)
        shutil.copyfile(source / "store.sqlite", root / "store.sqlite")
        shutil.copyfile(source / "matrix.toml", root / "matrix.toml")
        say(f"store bench {scale}x: {grow_from.scale}x's store repeated {copies} more times in SQL "
            f"({shape.nights - 1} nights), then one night ingested")
        _, took = _timed(lambda: grow(root / "store.sqlite", copies, grow_from.nights))
        say(f"  grown in {took:.0f}s")
        history = History(root, root / "matrix.toml", root / "runs", shape, cell_ids(shape.cells),
                          test_ids(shape.tests))
        tonight = _night_after(history, shape.nights - 1)
        built = f"grown from {grow_from.scale}x"
    with Store(root / "store.sqlite") as store:
        if grow_from is None:  # the ingested history's last night is tonight's
            nightly, nightly_s = _timed(lambda: ingest_runs(store, [tonight]))
            say(f"  tonight's ingest (one night into the full store): {nightly.results:,} results in {nightly_s:.1f}s")
        now = START + timedelta(days=shape.nights - 1, hours=12)
        gate, gate_s = _timed(lambda: evaluate(store, "release", matrix_path=history.matrix, now=now))
        gate_cpu = _timed.cpu
        say(f"  gate (release): {gate.status} in {gate_s:.2f}s ({gate_cpu:.2f}s CPU)")
        site = root / "site"
        _, dashboard_s = _timed(lambda: render_dashboard(store, site, matrix_path=history.matrix, now=now,
                                                         audit_dir=None))
        dashboard_cpu = _timed.cpu
        say(f"  dashboard: {dashboard_s:.1f}s ({dashboard_cpu:.1f}s CPU), index.html "
            f"{(site / 'index.html').stat().st_size / 1e3:,.0f} kB")
        if grow_from is not None:  # last: at a year it is the slow step (verdicts of every touched cell)
            nightly, nightly_s = _timed(lambda: ingest_runs(store, [tonight]))
            say(f"  tonight's ingest (one night into the full store): {nightly.results:,} results in {nightly_s:.1f}s")
        total = store.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    pages = [p for p in site.rglob("*.html")]
    figures = StoreFigures(
        scale=scale, nights=shape.nights, cells=shape.cells, tests=shape.tests, results=total, built=built,
        generate_s=round(generate_s, 1), ingest_s=round(ingest_s, 1),
        ingest_rate=round(ingested / ingest_s) if ingest_s else 0,
        ingest_cpu_rate=round(ingested / ingest_cpu) if ingest_cpu else 0,
        nightly_ingest_s=round(nightly_s, 2), gate_s=round(gate_s, 4), gate_cpu_s=round(gate_cpu, 4),
        gate_status=gate.status, dashboard_s=round(dashboard_s, 1), dashboard_cpu_s=round(dashboard_cpu, 1),
        index_bytes=(site / "index.html").stat().st_size,
        largest_page_bytes=max(p.stat().st_size for p in pages), pages=len(pages),
        site_bytes=sum(p.stat().st_size for p in site.rglob("*") if p.is_file()),
        store_bytes=sum(p.stat().st_size for p in root.glob("store.sqlite*")),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        load=(round(load_before, 1), round(os.getloadavg()[0], 1)),
    )
    return figures


def run_store_bench(console: Console, *, scales: tuple[int, ...] = SCALES, root: Path = DEFAULT_ROOT,
                    keep: bool = False, cells: int = 50, tests: int = 300, ingest_up_to: int = max(SCALES)) -> int:
    """Measures every scale (each in its own directory, removed after unless `keep`);
    scales above `ingest_up_to` are grown in SQL from the largest one ingested. 0 when
    the goals hold at the largest scale measured, else 1."""
    rows: list[StoreFigures] = []
    ingested: tuple[StoreFigures, Path] | None = None
    for scale in sorted(scales):
        where = Path(root) / f"x{scale}"
        if scale > ingest_up_to and ingested is not None:
            rows.append(measure(where, scale, console=console, grow_from=ingested[0], source=ingested[1]))
        else:
            rows.append(measure(where, scale, cells=cells, tests=tests, console=console))
            if ingested is not None and not keep:
                shutil.rmtree(ingested[1], ignore_errors=True)
            ingested = rows[-1], where
            continue
        if not keep:
            shutil.rmtree(where, ignore_errors=True)
    if ingested is not None and not keep:
        shutil.rmtree(ingested[1], ignore_errors=True)
    table = Table(title=f"store: {cells} cells x {tests} tests; 1x = {TODAY_NIGHTS} nights")
    table.add_column("")
    for f in rows:
        table.add_column(f"{f.scale}x: {f.nights} nights", justify="right")
    lines = [
        ("results", lambda f: f"{f.results:,}"),
        ("store built", lambda f: f.built),
        ("ingest (wall)", lambda f: f"{f.ingest_rate:,.0f}/s" if f.ingest_rate else "-"),
        ("ingest (per CPU s)", lambda f: f"{f.ingest_cpu_rate:,.0f}/s" if f.ingest_cpu_rate else "-"),
        ("tonight's ingest", lambda f: f"{f.nightly_ingest_s:.1f} s"),
        ("gate (wall / CPU)", lambda f: f"{f.gate_s:.2f} / {f.gate_cpu_s:.2f} s"),
        ("dashboard (wall / CPU)", lambda f: f"{f.dashboard_s:.1f} / {f.dashboard_cpu_s:.1f} s"),
        ("index.html", lambda f: f"{f.index_bytes / 1e3:,.0f} kB"),
        ("largest page", lambda f: f"{f.largest_page_bytes / 1e3:,.0f} kB"),
        ("site", lambda f: f"{f.site_bytes / 1e6:.1f} MB, {f.pages} pages"),
        ("store", lambda f: f"{f.store_bytes / 1e6:,.0f} MB"),
        ("peak RSS so far", lambda f: f"{f.peak_rss_mb:,.0f} MB"),
        ("load (1 min)", lambda f: f"{f.load[0]} -> {f.load[1]}"),
    ]
    for name, cell in lines:
        table.add_row(name, *(cell(f) for f in rows))
    console.print(table)
    out = Path(root) / "figures.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"measured_at": datetime.now().astimezone().isoformat(timespec="minutes"),
                               "cpus": os.cpu_count(), "goals": GOALS,
                               "scales": [asdict(f) | {"goals_met": f.goals()} for f in rows]}, indent=1))
    console.print(f"written {out}")
    largest = rows[-1]
    met = {**next((f.goals() for f in reversed(rows) if f.ingest_rate), {}), **largest.goals()}
    console.print(f"goals at {largest.scale}x (ingest >= 20k results/s at the largest ingested scale, gate <= 2 s, "
                  "dashboard <= 30 s): " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in met.items()))
    return 0 if all(met.values()) else 1
