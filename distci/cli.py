"""`python -m distci ...`: the commands nox sessions call.

Each subcommand is registered by the module that owns it (its `add_parser(sub)`);
`REGISTRY` below lists those modules explicitly, and a module that fails to import is
an error naming it (exit 2), never a command that silently vanishes from `--help`.
This file only wires them and turns DistciError into one line on stderr with exit code
2. It is the top of the import graph: no module imports it at import time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from distci.errors import ConfigError, DistciError


def _cmd_matrix(args: argparse.Namespace) -> int:
    from distci.matrix import load_matrix

    matrix = load_matrix(args.matrix)
    if args.json:
        tier = args.tier or "nightly"
        include = matrix.actions_include(tier)
        print(json.dumps({"include": include}))
        if args.github_output:
            from distci.ci.actions import append_step_summary, write_outputs

            cells = matrix.actions_include(tier, sharded=False)
            write_outputs({"matrix": json.dumps({"include": include}, separators=(",", ":")),
                           "cell_matrix": json.dumps({"include": cells}, separators=(",", ":")),
                           "cells": str(len(cells)), "jobs": str(len(include)), "tier": tier})
            append_step_summary(f"### {tier}: {len(cells)} cells in {len(include)} jobs\n" + "".join(
                f"- `{e['cell']}`{' shard ' + e['shard'] if e.get('shard') else ''} on `{', '.join(e['runner'])}`\n"
                for e in include))
        return 0
    for cell in matrix.select(tier=args.tier):
        print(f"{cell.id:70s} tiers={','.join(cell.tiers)} runner={','.join(cell.runner)}")
    return 0


def _shard_arg(text: str) -> str:
    from distci.run.shards import parse_shard

    try:
        parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _cmd_run(args: argparse.Namespace) -> int:
    """Run the cells; every line fits the terminal's width (distci.run.terminal)."""
    from distci.command import write_exit_file
    from distci.run.terminal import EXIT_CODES, exit_line, fitted_output, run_records

    # A pipe (nox, CI) would otherwise hold the per-test lines in a block buffer.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    with fitted_output():
        code, runs = _run_cells(args)
        write_exit_file("run", code, EXIT_CODES[code], runs=run_records(runs))
        print(exit_line(code))
    return code


def run_tier(args: argparse.Namespace) -> str | None:
    """The tier a run's tests are selected from: `--tier`, else `pr`; but tests named with
    `--test` and no `--tier` run whatever tier they belong to. The repro line every failure
    prints (`--cell C --test ID`) names no tier, and a nightly test's repro must run that
    test, not report that the pr tier holds none of it."""
    if args.tier is not None:
        return args.tier
    return None if args.test else "pr"


def _resumed_runs(args: argparse.Namespace, cells: list) -> list:
    """The runs `--resume` names, checked before anything is provisioned: one cell's, on
    the venv backend (a container sees only its own run directory)."""
    if not args.resume:
        return []
    from distci.rundir import RunDirError
    from distci.run.cellrun import uses_installed
    from distci.run.resume import check_same_stack, read_resumed

    if args.backend == "docker":
        raise ConfigError("--resume runs on the venv backend only; drop --backend docker")
    if len(cells) != 1:
        raise ConfigError(f"--resume continues one cell's runs; name that cell with --cell (this selects {len(cells)})")
    try:
        runs = read_resumed(args.resume, cells[0].id)
    except RunDirError as exc:
        raise ConfigError(f"--resume {exc}") from None
    installed = (args.python or sys.executable) if uses_installed(cells[0], args.python) else None
    check_same_stack(runs, cells[0].sources, installed)
    return runs


def _run_cells(args: argparse.Namespace) -> tuple[int, list]:
    from distci.run.cellrun import run_cell
    from distci.run.fixesmode import fixes_override
    from distci.matrix import load_matrix
    from distci.rundir import RunDir
    from distci.run.terminal import exit_code, print_summary

    matrix = load_matrix(args.matrix)
    tier = run_tier(args)
    cells = fixes_override(matrix.select(cell_ids=args.cell or None, tier=None if args.cell else (args.tier or "pr")))
    resume = _resumed_runs(args, cells)
    if args.backend == "docker":
        from distci.images import run_cells_in_docker

        runs = run_cells_in_docker(cells, runs_root=Path(args.runs_root), tests=args.test, keyword=args.k,
                                   tier=tier, shard=args.shard)
    else:
        extra = [f"--distci-known-issues={Path(args.known_issues).resolve()}"] if args.known_issues else []
        runs = [run_cell(c, runs_root=Path(args.runs_root), tests=args.test, keyword=args.k, tier=tier,
                         extra_pytest_args=extra, python=args.python, shard=args.shard, resume=resume) for c in cells]
    print_summary(runs)
    for run in runs:
        if getattr(run, "selection_error", ""):
            print(f"distci: {run.selection_error}", file=sys.stderr)
    code = exit_code(runs)
    for run in runs:
        run.info.exit_code = exit_code([run])
        RunDir(run.run_dir).write_info(run.info)
    return code, runs


def _cmd_bench(args: argparse.Namespace) -> int:
    from distci.bench.harness import run_bench

    return run_bench(args.what, args)


# The modules that register subcommands (each has add_parser(sub)), in --help order.
REGISTRY = (
    "distci.judge.ingest",       # ingest
    "distci.judge.gate",         # gate
    "distci.judge.export",       # export
    "distci.dashboard",    # dashboard
    "distci.audit.run",        # fixes-audit
    "distci.bisect",       # bisect
    "distci.images",       # images, teardown
    "distci.run.runreport",    # runreport
    "distci.ci",           # aggregate
    "distci.judge.notify",       # notify
    "distci.run.fuzz",           # fuzz
)


class CommandImportError(RuntimeError):
    """A registered command module does not import: distci is broken, not the user's input."""


def build_parser(registry: tuple[str, ...] = REGISTRY) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="distci", description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="matrix.toml", help="the matrix file (default: matrix.toml)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("matrix", help="list the cells, or print them as a GitHub Actions include list")
    p.add_argument("--json", action="store_true", help="print {'include': [...]} for a GitHub Actions matrix")
    p.add_argument("--tier", default=None)
    p.add_argument("--github-output", action="store_true",
                   help="with --json: also write matrix=, cells=, tier= to $GITHUB_OUTPUT and a step summary")
    p.set_defaults(fn=_cmd_matrix)

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
    p.set_defaults(fn=_cmd_run)

    p = sub.add_parser("bench", help="benchmarks: `harness` (rank pool vs torchrun per test), `images` (cold vs warm "
                       "builds), `provision` (a cell's env, cold and warm), `pr` (the pr tier's phases, cold then warm), "
                       "`store` (ingest, gate, dashboard at 1/10/100x), `fuzz-ops` (op cases an hour)")
    p.add_argument("what", choices=("harness", "images", "provision", "pr", "store", "fuzz-ops"))
    p.add_argument("--budget-s", type=float, default=None, help="fuzz-ops: seconds of fuzzing (default 600)")
    p.add_argument("--repeat", type=int, default=1, help="pr: how many runs of the tier (default 2: cold, then warm)")
    p.add_argument("--pip", action="store_true", help="provision: also time the pip fallback install")
    p.add_argument("--keep", action="store_true", help="provision, store: keep what the bench generated")
    p.add_argument("--scales", default="1,10,100", help="store: the scales to measure (default 1,10,100)")
    p.add_argument("--ingest-up-to", type=int, default=None,
                   help="store: scales above this are the largest ingested store grown in SQL (default: ingest all)")
    p.add_argument("--root", default=None, help="store: where the histories and figures.json go (default .distci/bench-store)")
    p.set_defaults(fn=_cmd_bench)

    for module in registry:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise CommandImportError(f"cannot load the commands of {module}: {exc}") from exc
        register = getattr(mod, "add_parser", None)
        if register is None:
            raise CommandImportError(f"{module} is in distci.cli.REGISTRY but has no add_parser(sub)")
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
    except CommandImportError as exc:
        print(f"distci: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except DistciError as exc:
        print(f"distci: error: {exc}", file=sys.stderr)
        return _exit(args, 2)
    except KeyboardInterrupt:
        print("distci: interrupted", file=sys.stderr)
        return _exit(args, 130)


def _exit(args: argparse.Namespace, code: int) -> int:
    """`run` names its exit code on its last line whichever way it ends; every command's
    usage error (2) or interruption reaches the exit file (distci.command)."""
    from distci.command import write_exit_file
    from distci.run.terminal import EXIT_CODES, exit_line

    if args.command == "run":
        print(exit_line(code), file=sys.stderr)
    write_exit_file(args.command, code, EXIT_CODES.get(code, ""))
    return code
