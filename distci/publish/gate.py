"""`distci gate`: the release gate's answer, published: printed, appended to the Actions
step summary, and left in the exit file (0 PASSED, 1 BLOCKED, 3 INCOMPLETE, 2 a usage error).

The judgement itself (coverage, blocking tests, cell states) is distci.judge.gate's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from distci.ci.actions import append_step_summary
from distci.command import write_exit_file
from distci.errors import SelectionError
from distci.judge.coverage import parse_duration
from distci.judge.gate import STATUS_MEANINGS, evaluate, evaluate_candidate, explain_blocking
from distci.judge.store import Store, default_store_path
from distci.run.fitting import columns, fit_text


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers `gate` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "gate",
        help="PASSED (0) / BLOCKED (1) / INCOMPLETE (3): may this tier ship?",
        description="Compare the store with matrix.toml's cells for a tier and list what blocks "
        "or is missing. Exit 0 PASSED, 1 BLOCKED, 3 INCOMPLETE (a cell missing, stale, infra-only "
        "or in flight), 2 usage error.",
    )
    p.add_argument("--tier", default="release", help="tier whose cells are expected (default: release)")
    p.add_argument(
        "--candidate",
        default=None,
        help="judge the matrix's cells whose id contains this (a cell id or a Source, e.g. torch_test)",
    )
    p.add_argument("--max-age", default="36h", help="a cell's latest run older than this is stale (default 36h)")
    p.add_argument("--waive", action="append", default=[], metavar="CELL",
                   help="accept this cell being missing/stale/infra-only (repeatable; needs --reason)")
    p.add_argument("--reason", action="append", default=[], help="why the --waive before it is acceptable")
    p.add_argument(
        "--matrix", default=argparse.SUPPRESS, help="matrix file declaring cells and blocking suites (default matrix.toml)"
    )
    p.add_argument(
        "--store", type=Path, default=None, help="store file (default $DISTCI_STORE or .distci/store.sqlite)"
    )
    p.set_defaults(fn=run)
    return p


def waivers_of(cells: Sequence[str], reasons: Sequence[str]) -> dict[str, str]:
    """`--waive A --reason X --waive B --reason Y` as {A: X, B: Y}; every waiver needs its reason."""
    if len(cells) != len(reasons) or any(not r.strip() for r in reasons):
        raise SelectionError("every --waive CELL needs its own --reason TEXT")
    return dict(zip(cells, reasons))


def run(args: argparse.Namespace) -> int:
    matrix = Path(getattr(args, "matrix", "matrix.toml"))
    store_path = args.store or default_store_path()
    if not Path(store_path).exists():
        raise SelectionError(f"no store at {store_path}; run `nox -s ingest -- PATH...` first")
    if not matrix.exists():
        raise SelectionError("no matrix file: the gate needs it to know which cells should exist", where=str(matrix))
    opts = {"matrix_path": matrix, "max_age": parse_duration(args.max_age), "waivers": waivers_of(args.waive, args.reason)}
    with Store(store_path, reading=True) as store:
        if args.candidate:
            result = evaluate_candidate(store, args.candidate, tier=args.tier, **opts)
        else:
            result = evaluate(store, args.tier, **opts)
        explain_blocking(store, result)
    print(fit_text(result.to_text(columns())))  # every line within $COLUMNS; repro lines stay pasteable
    append_step_summary(result.to_markdown())
    write_exit_file("gate", result.exit_code, f"{result.status}: {STATUS_MEANINGS[result.status]}",
                    status=result.status, tier=result.tier, candidate=result.candidate,
                    incomplete=[c.cell_id for c in result.incomplete], blocking=len(result.blocking))
    return result.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m distci.publish.gate` is `python -m distci gate`."""
    from distci.command import run_module

    return run_module(add_parser, argv)


if __name__ == "__main__":
    sys.exit(main())
