"""`python -m distci aggregate ...`: the CI steps' commands (nightly, bisect-result, stack, cell).

Arguments are parsed here once and handed to the library as typed values.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from distci.ci.actions import cell_outputs, default_remote, workflow_run_url, write_outputs
from distci.provision.github import DEFAULT_API_URL
from distci.ci.history import DATA_BRANCH, History
from distci.ci.nightly import AggregateOptions, aggregate, bisect_record, record_bisect
from distci.ci.regressions import expected_cells_of
from distci.errors import SelectionError
from distci.rundir import STACK_FILE


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, default=Path(".distci") / "aggregate" / "data",
                   help="checkout of the history branch (made when missing)")
    p.add_argument("--data-remote", default=None,
                   help="git remote of the history (default: $GITHUB_SERVER_URL/$GITHUB_REPOSITORY.git in Actions, "
                        "else none: a plain local directory)")
    p.add_argument("--data-branch", default=DATA_BRANCH)
    p.add_argument("--store", type=Path, default=Path(".distci") / "aggregate" / "store.sqlite")
    p.add_argument("--repo", default=None, help="owner/name (default $GITHUB_REPOSITORY)")
    p.add_argument("--api-url", default=None, help=f"REST API root (default $GITHUB_API_URL or {DEFAULT_API_URL})")
    p.add_argument("--dry-run", action="store_true", help="write nothing to GitHub or the branch; print the plan")


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    sub = parser.add_subparsers(dest="what", required=True)

    p = sub.add_parser("nightly", help="aggregate a night's artifacts (the nightly.yml aggregate job)")
    p.add_argument("artifacts", nargs="*", type=Path, help="downloaded artifacts: run directories or parents of many")
    _common(p)
    p.add_argument("--site", type=Path, default=None, help="render the dashboard into this directory")
    p.add_argument("--expect", type=Path, default=None,
                   help="`distci matrix --json` output: cells without a run get an infra result")
    p.add_argument("--expect-json", default=None, help="the same, given as the JSON text itself")
    p.add_argument("--tier", default="nightly")
    p.add_argument("--ref", default=None, help="ref bisect.yml is dispatched on (default $GITHUB_REF_NAME or main)")
    p.add_argument("--issues", action=argparse.BooleanOptionalAction, default=True,
                   help="open issues and dispatch bisects for new regressions (default: yes)")
    p.add_argument("--max-bisects", type=int, default=4, help="bisects dispatched per night at most (default 4)")
    p.add_argument("--report", type=Path, default=None, help="write the aggregate report as JSON here")
    p.add_argument("--title", default="distci")
    p.set_defaults(fn=_cmd_nightly)

    p = sub.add_parser("bisect-result", help="record a bisect report in the history and on its issue")
    p.add_argument("--report", type=Path, default=None, help="the bisect's report.json (missing: status error)")
    for name in ("test-id", "good", "bad", "axis", "cell"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--issue", default="", help="issue number to comment on (empty: none)")
    _common(p)
    p.set_defaults(fn=_cmd_bisect_result)

    p = sub.add_parser("stack", help="write a stored run's stack.json (the pins of a bisect) from the history")
    p.add_argument("run_id")
    p.add_argument("--out", type=Path, required=True)
    _common(p)
    p.set_defaults(fn=_cmd_stack)

    p = sub.add_parser("cell", help="print a cell's runner labels etc. as key=value lines (for $GITHUB_OUTPUT)")
    p.add_argument("cell")
    p.add_argument("--matrix", default="matrix.toml")
    p.set_defaults(fn=_cmd_cell)
    return parser


def _cmd_nightly(args: argparse.Namespace) -> int:
    opts = AggregateOptions(
        artifacts=list(args.artifacts), data=args.data, data_remote=default_remote(args.data_remote),
        data_branch=args.data_branch, store=args.store, site=args.site, expect=args.expect, tier=args.tier,
        expect_cells=expected_cells_of(json.loads(args.expect_json)) if args.expect_json else None,
        dry_run=args.dry_run, issues=args.issues, ref=args.ref or os.environ.get("GITHUB_REF_NAME") or "main",
        repo=args.repo, api_url=args.api_url, max_bisects=args.max_bisects, title=args.title, report=args.report,
    )
    aggregate(opts)
    return 0


def _cmd_bisect_result(args: argparse.Namespace) -> int:
    record = bisect_record(args.report, test_id=args.test_id, axis=args.axis, good=args.good, bad=args.bad,
                           cell_id=args.cell, run_url=workflow_run_url())
    issue = int(args.issue) if str(args.issue).strip().isdigit() else None
    path = record_bisect(record, data=args.data, data_remote=default_remote(args.data_remote),
                         data_branch=args.data_branch, store=args.store, issue=issue, dry_run=args.dry_run,
                         repo=args.repo, api_url=args.api_url)
    print(f"aggregate: bisect {record['status']}: {path}")
    return 0


def _cmd_stack(args: argparse.Namespace) -> int:
    if not re.fullmatch(r"[\w.+-]+", args.run_id):
        raise SelectionError(f"not a run id: {args.run_id!r}")
    history = History(args.data, remote=default_remote(args.data_remote), branch=args.data_branch,
                      token=os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN"))
    data = history.read(f"runs/{args.run_id}/{STACK_FILE}")
    if data is None:
        raise SelectionError(f"run {args.run_id} has no {STACK_FILE} in the history ({args.data_branch})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"aggregate: {args.out}")
    return 0


def _cmd_cell(args: argparse.Namespace) -> int:
    print(write_outputs(cell_outputs(args.cell, args.matrix)), end="")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Registers `aggregate` on the distci CLI (`python -m distci aggregate nightly ...`)."""
    p = sub.add_parser("aggregate", help="the CI aggregate: history, store, issues, bisects, dashboard")
    return build_parser(p)
