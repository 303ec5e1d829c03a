"""The static dashboard: a page people decide from, written from the results store.

`render_dashboard(store, out_dir)` writes index.html (server-side rendered with Jinja2,
charts as inline SVG), audit.html (the latest fix audit), assets/ and data.json. The
page opens with the release view: per tier, the gate's answer and what blocks it. The site needs no server and no network:
open it from file:// or publish the directory on GitHub Pages.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from distci.dashboard.render import render_dashboard
from distci.errors import SelectionError
from distci.judge.store import DEFAULT_AUDIT_DIR, Store, default_store_path

DEFAULT_OUT = Path(".distci") / "site"

__all__ = ["DEFAULT_OUT", "add_parser", "main", "render_dashboard", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers `dashboard` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "dashboard",
        help="write the static results dashboard",
        description="Write the static dashboard (index.html, assets/, data.json) from the results store.",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument(
        "--store", type=Path, default=None, help="store file (default $DISTCI_STORE or .distci/store.sqlite)"
    )
    p.add_argument(
        "--audit-dir", type=Path, default=DEFAULT_AUDIT_DIR, help="fix audit files, used when the store has none"
    )
    p.add_argument("--history", type=int, default=14, help="runs per cell in the history and trend (default 14)")
    p.add_argument("--title", default="distci", help="page title")
    p.add_argument("--issues", type=Path, default=None,
                   help="JSON object: error signature -> URL of the issue filed for it (linked from its card)")
    p.add_argument("--known-issues", type=Path, default=None,
                   help="known-issues registry the chips link upstream from (default suites/known_issues.toml)")
    p.add_argument("--matrix", default=argparse.SUPPRESS,
                   help="matrix file whose tiers the release view judges (default matrix.toml)")
    p.set_defaults(fn=run)
    return p


def run(args: argparse.Namespace) -> int:
    store_path = args.store or default_store_path()
    if not Path(store_path).exists():
        raise SelectionError(f"no store at {store_path}; run `nox -s ingest -- PATH...` first")
    issues = json.loads(Path(args.issues).read_text()) if args.issues else None
    with Store(store_path, reading=True) as store:
        index = render_dashboard(store, args.out, title=args.title, audit_dir=args.audit_dir, history_runs=args.history,
                                 matrix_path=Path(getattr(args, "matrix", "matrix.toml")), issues=issues,
                                 **({"known_issues": args.known_issues} if args.known_issues else {}))
    print(f"wrote {index}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m distci.dashboard` is `python -m distci dashboard`."""
    from distci.command import run_module

    return run_module(add_parser, argv)


if __name__ == "__main__":
    sys.exit(main())
