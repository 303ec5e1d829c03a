"""The table a person reads at the end of `nox -s dist_tests`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .cellrun import CellRun
from .rundir import RunDir


def print_summary(runs: list[CellRun], console: Console | None = None) -> None:
    console = console or Console(width=None if Console().is_terminal else 200)
    table = Table(title="distci results", show_lines=False)
    for col in ("cell", "passed", "failed", "known", "skipped", "infra", "time", "results"):
        table.add_column(col, justify="right" if col not in ("cell", "results") else "left", no_wrap=True)
    for run in runs:
        known = sum(bool(r.known_issue) for r in run.results)
        infra = sum(r.failure_kind == "infra" for r in run.results)
        secs = sum(r.duration_s for r in run.results)
        failed = len(run.failed)
        style = "red" if failed else ("yellow" if infra else "green")
        table.add_row(run.info.cell_id, str(run.count("passed")), str(failed), str(known),
                      str(run.count("skipped")), str(infra), f"{secs:.0f}s", _relative(RunDir(run.run_dir).results_path),
                      style=style)
    console.print(table)
    for run in runs:
        for r in run.results:
            if r.outcome in ("failed", "error"):
                tag = "infra" if r.failure_kind == "infra" else ("known " + r.known_issue if r.known_issue else r.failure_kind)
                console.print(f"[bold]{r.test_id}[/bold] [{tag}] {r.error_signature}")
                console.print(f"    repro: {r.repro}", markup=False, highlight=False)


def _relative(path) -> str:
    from pathlib import Path

    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
