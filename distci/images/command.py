"""`python -m distci images` (build the cells' images), `python -m distci teardown`, the image bench."""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path
from typing import Callable

from distci.errors import ConfigError, InfraError, SourceError
from distci.images.base import connect, image_exists
from distci.images.build import ensure_image
from distci.images.plan import plan_image
from distci.images.run import teardown
from distci.provision.selfwheels import build_all
from distci.provision.wheelhouse import ensure_wheelhouse

Log = Callable[[str], None]


def _cmd_images(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from distci.matrix import load_matrix

    matrix = load_matrix(args.matrix)
    cells = matrix.select(cell_ids=args.cell or None, tier=None if args.cell else (args.tier or "pr"))
    client = connect()
    table = Table(title="distci images")
    for col in ("cell", "tag", "image id", "built", "time"):
        table.add_column(col, no_wrap=True)
    failed = 0
    for cell in cells:
        try:
            image = ensure_image(cell, client, force=args.force, nocache=args.no_cache)
        except (InfraError, SourceError, ConfigError) as exc:
            failed += 1
            print(f"distci: infra: {cell.id}: {exc}", file=sys.stderr)
            table.add_row(cell.id, "-", "-", "failed", "-", style="red")
            continue
        table.add_row(cell.id, image.tag, image.id[:19], "built" if image.built else "reused",
                      f"{image.seconds:.1f}s")
    Console(width=None if Console().is_terminal else 220).print(table)
    return 3 if failed else 0


def add_parser(sub) -> None:
    p = sub.add_parser("images", help="build the cells' images (docker/<family>/Dockerfile) with the Docker SDK")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--cell", action="append", help="cell id (repeatable, globs allowed); default: the --tier's cells")
    which.add_argument("--tier", help="every cell of this tier (default: pr, as `distci run`)")
    p.add_argument("--force", action="store_true", help="build even when the tag exists (the layer cache still applies)")
    p.add_argument("--no-cache", action="store_true", help="build without the layer cache")
    p.set_defaults(fn=_cmd_images)

    p = sub.add_parser("teardown", help="remove this job's containers (the workflows' always-run last step)")
    p.add_argument("--job", default=None, help="job label (default: DISTCI_JOB, else gh$GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT)")
    p.add_argument("--cell", default=None, help="only this cell's containers")
    p.add_argument("--run", default=None, help="only this run's containers")
    p.set_defaults(fn=_cmd_teardown)


def _cmd_teardown(args: argparse.Namespace) -> int:
    try:
        client = connect(timeout=120)
    except InfraError as exc:
        print(f"teardown: nothing to do: {exc}", file=sys.stderr)
        return 0
    teardown(client, job=args.job, cell=args.cell, run=args.run)
    return 0


WARM_GOAL_S = 15.0


def bench_images(cell_id: str | None = None, matrix_path: str = "matrix.toml", *, log: Log = print) -> dict[str, float]:
    """Cold build (no layer cache) vs warm build after an edit of fixes/; prints both and their ratio.

    The wheelhouse and distci's wheels are prepared first and not timed: this measures
    the image build alone. Both builds get throwaway tags, removed at the end.
    """
    from rich.console import Console
    from rich.table import Table

    from distci.matrix import load_matrix

    matrix = load_matrix(matrix_path)
    cell = matrix.cell(cell_id) if cell_id else matrix.default_cell()
    client = connect()
    plan = plan_image(cell, client, log=log)
    ensure_wheelhouse(plan.requirements, plan.pip_args, python=plan.python, target=plan.target, log=log)
    build_all(Path(".distci") / "selfwheels", log=log)
    nonce = uuid.uuid4().hex[:8]
    tags = [f"{plan.tag}-bench-cold-{nonce}", f"{plan.tag}-bench-warm-{nonce}"]
    try:
        cold = ensure_image(cell, client, force=True, nocache=True, touch_fixes=f"cold {nonce}", tag=tags[0], log=log)
        warm = ensure_image(cell, client, force=True, touch_fixes=f"warm {nonce}", tag=tags[1], log=log)
    finally:
        for tag in tags:
            if image_exists(client, tag):
                client.images.remove(tag, noprune=False)
    ratio = cold.seconds / warm.seconds if warm.seconds else float("inf")
    table = Table(title=f"image build: {cell.id}")
    for col in ("build", "seconds", "steps cached"):
        table.add_column(col)
    table.add_row("cold (no cache)", f"{cold.seconds:.1f}", f"{len(cold.cached_steps)}/{cold.steps}")
    table.add_row("warm (fixes/ edited)", f"{warm.seconds:.1f}", f"{len(warm.cached_steps)}/{warm.steps}")
    console = Console()
    console.print(table)
    verdict = "met" if warm.seconds <= WARM_GOAL_S else "NOT met"
    console.print(f"cold/warm = {ratio:.1f}x; goal warm <= {WARM_GOAL_S:.0f}s {verdict}")
    return {"cold_s": cold.seconds, "warm_s": warm.seconds, "ratio": ratio}
