"""`distci run`: provision cells and run their suites, as named steps.

The command is an `Application` in mozregression's sense (or nox's `tasks`): its
collaborators are built once from typed options (`RunOptions`), and `main` calls the
steps in order, each a function a reader or a test can take alone:

    select_cells     matrix.toml's cells for --cell / --tier, fixes mode applied
    check_selection  -k / --test against the collected ids, where they are known without the cell
    resumed_runs     the runs --resume names, checked before anything is provisioned
    run_cells        each cell on its backend (venv: distci.run.cellrun; others, docker included,
                     registered by their own stage under the `distci.run_backends` entry points)
    report           the summary table and any selection error, then the exit code
    record_exits     each run's own part of that exit code into its run.json

The exit file and the fitted terminal wrap them all (`run`), so whichever way the
command ends, its last line names its exit code.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from distci.cells import Cell
from distci.errors import ConfigError
from distci.rundir import CellRun, RunContents, RunDir, parse_shard


@dataclass(frozen=True)
class RunOptions:
    """What `distci run` was asked, typed (the steps never see argparse's namespace)."""

    matrix: Path = Path("matrix.toml")
    cells: tuple[str, ...] = ()
    tier: str | None = None
    keyword: str | None = None
    tests: tuple[str, ...] = ()
    shard: str | None = None
    resume: tuple[str, ...] = ()
    backend: str = "venv"
    runs_root: Path = Path(".distci/runs")
    known_issues: Path | None = None
    python: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RunOptions":
        return cls(matrix=Path(args.matrix), cells=tuple(args.cell or ()), tier=args.tier, keyword=args.k,
                   tests=tuple(args.test or ()), shard=args.shard, resume=tuple(args.resume or ()),
                   backend=args.backend, runs_root=Path(args.runs_root),
                   known_issues=Path(args.known_issues) if args.known_issues else None, python=args.python)

    @property
    def test_tier(self) -> str | None:
        """The tier a run's tests are selected from: `--tier`, else `pr`; but tests named with
        `--test` and no `--tier` run whatever tier they belong to. The repro line every failure
        prints (`--cell C --test ID`) names no tier, and a nightly test's repro must run that
        test, not report that the pr tier holds none of it."""
        if self.tier is not None:
            return self.tier
        return None if self.tests else "pr"


def select_cells(options: RunOptions) -> list[Cell]:
    """The cells to run: those named with --cell, else the tier's (default pr), fixes mode applied."""
    from distci.external.spec import suite_names
    from distci.matrix import load_matrix
    from distci.run.fixesmode import fixes_override

    matrix = load_matrix(options.matrix, external_names=suite_names)
    return fixes_override(matrix.select(cell_ids=list(options.cells) or None,
                                        tier=None if options.cells else (options.tier or "pr")))


def check_registry(options: RunOptions) -> None:
    """The known-issues registry the cells will read, validated here, once, before anything
    is provisioned: a mistake in it is one line and exit 2, not a cell that fails to start."""
    from distci.known_issues import load_registry
    from distci.provision.selfwheels import REPO

    registry = options.known_issues or REPO / "suites" / "known_issues.toml"
    if options.known_issues or registry.exists():
        load_registry(registry)


def check_selection(options: RunOptions, cells: Sequence[Cell]) -> None:
    """A -k / --test that matches nothing fails here, in seconds, before anything is
    provisioned, where the cell's ids can be collected without the cell (distci.run.precheck)."""
    from distci.provision.envs import default_root
    from distci.run.precheck import Remembered, check_selection as check

    check(cells, tests=options.tests, keyword=options.keyword, tier=options.test_tier, python=options.python,
          env_root=default_root(), remembered=Remembered(default_root().parent / "precheck"))


def resumed_runs(options: RunOptions, cells: Sequence[Cell]) -> list[RunContents]:
    """The runs `--resume` names, checked before anything is provisioned: one cell's, on
    the venv backend (a container sees only its own run directory)."""
    if not options.resume:
        return []
    from distci.rundir import RunDirError
    from distci.run.cellrun import uses_installed
    from distci.run.resume import check_same_stack, read_resumed

    if options.backend == "docker":
        raise ConfigError("--resume runs on the venv backend only; drop --backend docker")
    if len(cells) != 1:
        raise ConfigError(f"--resume continues one cell's runs; name that cell with --cell (this selects {len(cells)})")
    try:
        runs = read_resumed(options.resume, cells[0].id)
    except RunDirError as exc:
        raise ConfigError(f"--resume {exc}") from None
    installed = (options.python or sys.executable) if uses_installed(cells[0], options.python) else None
    check_same_stack(runs, cells[0].sources, installed)
    return runs


BACKENDS = "distci.run_backends"
"""The entry-point group of the backends other than venv: name -> `run_cells(cells, *, runs_root,
tests, keyword, tier, shard) -> [CellRun]`. The docker backend is the images stage's, a stage
above this one (it builds on run/cellrun): it registers itself in distci's metadata
(pyproject.toml) instead of being imported from here, as pytest finds its plugins."""


def backend(name: str) -> Callable[..., list[CellRun]]:
    """The backend registered as `name` (raises ConfigError naming the fix when there is none)."""
    from importlib.metadata import entry_points

    found = entry_points()
    group = found.select(group=BACKENDS) if hasattr(found, "select") else found.get(BACKENDS, ())
    for entry in group:
        if entry.name == name:
            return entry.load()
    raise ConfigError(f"--backend {name}: no such backend is registered (entry points {BACKENDS}); distci's "
                      "metadata may predate it: reinstall distci (`pip install -e .` in a checkout)")


def run_cells(options: RunOptions, cells: Sequence[Cell], resume: Sequence[RunContents]) -> list[CellRun]:
    """Each cell's run on its backend, in order."""
    tests, tier = list(options.tests) or None, options.test_tier
    if options.backend != "venv":
        return backend(options.backend)(list(cells), runs_root=options.runs_root, tests=tests,
                                        keyword=options.keyword, tier=tier, shard=options.shard)
    from distci.run.cellrun import run_cell

    extra = [f"--distci-known-issues={options.known_issues.resolve()}"] if options.known_issues else []
    return [run_cell(c, runs_root=options.runs_root, tests=tests, keyword=options.keyword, tier=tier,
                     extra_pytest_args=extra, python=options.python, shard=options.shard, resume=list(resume))
            for c in cells]


def report(runs: Sequence[CellRun]) -> int:
    """The summary table, each run's selection error (a typo in -k / --test), and the exit code."""
    from distci.run.terminal import exit_code, print_summary

    print_summary(list(runs))
    for run in runs:
        if run.selection_error:
            print(f"distci: {run.selection_error}", file=sys.stderr)
    return exit_code(list(runs))


def record_exits(runs: Sequence[CellRun]) -> None:
    """Each run's own part of the command's exit code, into its run.json."""
    from distci.run.terminal import exit_code

    for run in runs:
        run.info.exit_code = exit_code([run])
        RunDir(run.run_dir).write_info(run.info)


def main(options: RunOptions) -> tuple[int, list[CellRun]]:
    """The steps, in order: (the exit code, the runs)."""
    cells = select_cells(options)
    check_registry(options)
    check_selection(options, cells)
    resume = resumed_runs(options, cells)
    runs = run_cells(options, cells, resume)
    code = report(runs)
    record_exits(runs)
    return code, runs


def run(args: argparse.Namespace) -> int:
    """`distci run`: every line fits the terminal's width (distci.run.terminal); the exit
    file names the code and each cell's run."""
    from distci.command import write_exit_file
    from distci.run.terminal import EXIT_CODES, exit_line, fitted_output, run_records

    # A pipe (nox, CI) would otherwise hold the per-test lines in a block buffer.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    with fitted_output():
        code, runs = main(RunOptions.from_args(args))
        write_exit_file("run", code, EXIT_CODES[code], runs=run_records(runs))
        print(exit_line(code))
    return code


def _shard_arg(text: str) -> str:
    try:
        parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Registers `run` on the hub's subparsers."""
    p = sub.add_parser("run", help="provision cells and run their distributed suites")
    p.add_argument("--cell", action="append", help="cell id (repeatable); default: the --tier's cells")
    p.add_argument("--tier", default=None, help="tier whose cells (when no --cell is given) and tests run "
                   "(default: pr; tests named with --test run whatever their tier)")
    p.add_argument("-k", default=None, help="pytest -k expression")
    p.add_argument("--test", action="append", help="a test node id to run (repeatable)")
    p.add_argument("--shard", type=_shard_arg, default=None, metavar="K/N",
                   help="run the K-th of N shares of the tier's tests: N jobs run one cell's tier side by side, "
                        "and the gate joins their runs (the nightly cells run as 2 shards)")
    p.add_argument("--resume", action="append", metavar="RUN_DIR",
                   help="continue a run that stopped part-way (repeatable: each shard's or earlier resume's run): "
                        "run the same selection minus the tests these runs of the cell answered; `distci report` "
                        "over them all keeps each test's latest result")
    p.add_argument("--backend", choices=("venv", "docker"), default="venv")
    p.add_argument("--runs-root", default=".distci/runs")
    p.add_argument("--known-issues", default=None,
                   help="a known-issues registry to match failures against instead of suites/known_issues.toml")
    p.add_argument("--python", default=None, help="run on this interpreter's preinstalled stack: no download, "
                   "no stack venv (docs/installed-stack.md)")
    p.set_defaults(fn=run)
    return p
