"""`python -m distci ...`: the commands nox sessions call.

Each subcommand is registered by the module that owns it (add_parser + run); this file
only wires them and turns DistciError into one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import DistciError


def _cmd_matrix(args: argparse.Namespace) -> int:
    from .matrix import load_matrix

    matrix = load_matrix(args.matrix)
    if args.json:
        tier = args.tier or "nightly"
        print(json.dumps({"include": matrix.actions_include(tier)}))
        return 0
    for cell in matrix.select(tier=args.tier):
        print(f"{cell.id:70s} tiers={','.join(cell.tiers)} runner={','.join(cell.runner)}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .cellrun import run_cell
    from .matrix import load_matrix
    from .summary import print_summary

    matrix = load_matrix(args.matrix)
    cells = matrix.select(cell_ids=args.cell or None, tier=None if args.cell else args.tier)
    if args.backend == "docker":
        from .images import run_cells_in_docker  # issue 5

        runs = run_cells_in_docker(cells, args)
    else:
        runs = [run_cell(c, runs_root=Path(args.runs_root), tests=args.test, keyword=args.k, tier=args.tier,
                         python=args.python) for c in cells]
    print_summary(runs)
    if any(r.failed for r in runs):
        return 1
    if any(r.infra for r in runs):
        return 3
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    return run_bench(args.what, args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="distci", description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="matrix.toml", help="the matrix file (default: matrix.toml)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("matrix", help="list the cells, or print them as a GitHub Actions include list")
    p.add_argument("--json", action="store_true", help="print {'include': [...]} for a GitHub Actions matrix")
    p.add_argument("--tier", default=None)
    p.set_defaults(fn=_cmd_matrix)

    p = sub.add_parser("run", help="provision cells and run their distributed suites")
    p.add_argument("--cell", action="append", help="cell id (repeatable); default: the --tier's cells")
    p.add_argument("--tier", default="pr", help="tier whose cells run when no --cell is given (default: pr)")
    p.add_argument("-k", default=None, help="pytest -k expression")
    p.add_argument("--test", action="append", help="a test node id to run (repeatable)")
    p.add_argument("--backend", choices=("venv", "docker"), default="venv")
    p.add_argument("--runs-root", default=".distci/runs")
    p.add_argument("--python", default=None, help="run on this interpreter's preinstalled stack: no download, "
                   "no stack venv (docs/installed-stack.md)")
    p.set_defaults(fn=_cmd_run)

    p = sub.add_parser("bench", help="benchmarks: `harness` (rank pool vs torchrun per test), `images` (cold vs warm "
                       "builds), `provision` (a cell's env, cold and warm)")
    p.add_argument("what", choices=("harness", "images", "provision"))
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--pip", action="store_true", help="provision: also time the pip fallback install")
    p.add_argument("--keep", action="store_true", help="provision: keep the bench's wheelhouse and envs")
    p.set_defaults(fn=_cmd_bench)

    for module in ("store", "gate", "export", "dashboard", "audit", "bisect", "images", "runreport", "aggregate", "lint"):
        try:
            mod = __import__(f"distci.{module}", fromlist=["add_parser"])
        except ImportError:
            continue
        if hasattr(mod, "add_parser"):
            mod.add_parser(sub)
    return parser


def main_for(command: str, argv=None) -> int:
    """Lets `python -m distci.<module>` behave exactly like `python -m distci <command>`."""
    return main([command, *(argv if argv is not None else sys.argv[1:])])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except DistciError as exc:
        print(f"distci: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("distci: interrupted", file=sys.stderr)
        return 130
