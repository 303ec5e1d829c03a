"""`python -m distci ...`: the commands nox sessions call.

Each subcommand is registered by the module that owns it (its `add_parser(sub)`);
`COMMANDS` below lists them explicitly with their help line, and only the module of the
command being run is imported: `--help` of the hub and of every command works with the
controller's declared dependencies alone. A module that fails to import is an error
naming it (exit 2), never a command that silently vanishes.
This file only wires them and turns DistciError into one line on stderr with exit code
2. It is the top of the import graph: no module imports it at import time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from typing import Any, Collection, Sequence

from distci.errors import DistciError, error_text


def _cmd_matrix(args: argparse.Namespace) -> int:
    from distci.external.spec import suite_names
    from distci.matrix import load_matrix

    matrix = load_matrix(args.matrix, external_names=suite_names)
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


@dataclass(frozen=True)
class Command:
    """A subcommand the hub lists: its name, the module whose `add_parser(sub)` registers it,
    and the line `distci --help` shows. A module is imported only when its command runs,
    so `distci --help` and `distci CMD --help` need only the controller's declared
    dependencies and CMD's own (no pytest, no Docker SDK, no jinja2 for `gate --help`)."""

    name: str
    module: str
    help: str


# The commands registered by their owning modules, in --help order (`matrix` is the hub's
# own, declared in build_parser). tests/test_cli.py checks that each module
# registers exactly these names with these help lines.
COMMANDS = (
    Command("run", "distci.run.command", "provision cells and run their distributed suites"),
    Command("bench", "distci.bench.harness",
            "benchmarks: `harness` (rank pool vs torchrun per test), `images` (cold vs warm builds), `provision` (a "
            "cell's env, cold and warm), `pr` (the pr tier's phases, cold then warm), `store` (ingest, gate, "
            "dashboard at 1/10/100x), `multinode` (rendezvous on 2 and 4 simulated nodes; the pr rows on 2 nodes x "
            "1 rank against 1 node x 2 ranks), `fuzz-ops` (op cases an hour), `fuzz-programs` (training programs an hour)"),
    Command("ingest", "distci.judge.ingest", "index run directories into the results store"),
    Command("gate", "distci.publish.gate", "PASSED (0) / BLOCKED (1) / INCOMPLETE (3): may this tier ship?"),
    Command("export", "distci.publish.export",
            "export results for other systems (--hud: PyTorch HUD's cross-repo CI relay)"),
    Command("dashboard", "distci.dashboard", "write the static results dashboard"),
    Command("fixes-audit", "distci.audit.run", "run every fix's regression test off and on per torch version"),
    Command("bisect", "distci.bisect",
            "bisect a regression (or a fix): versions, commits, below-nightly, python-diff, compiler, list"),
    Command("images", "distci.images", "build the cells' images (docker/<family>/Dockerfile) with the Docker SDK"),
    Command("teardown", "distci.images", "remove this job's containers (the workflows' always-run last step)"),
    Command("report", "distci.run.runreport", "render run directories (one cell's shards) as a Markdown evidence page"),
    Command("aggregate", "distci.ci.command", "the CI aggregate: history, store, issues, bisects, dashboard"),
    Command("notify", "distci.publish.notify",
            "post new regressions and a not-PASSED gate to a webhook ($DISTCI_WEBHOOK_URL)"),
    Command("hosts-teardown", "distci.launch.command",
            "remove simulated hosts (network namespaces distci-*) a killed run left"),
    Command("cluster-check", "distci.launch.command", "run the multi-node placement check on simulated hosts"),
    Command("trainjob", "distci.launch.command",
            "print a multi-node cell's Kubernetes TrainJob (validated), or --submit it"),
    Command("sbatch-script", "distci.launch.command", "print a multi-node cell's Slurm batch script"),
    Command("fuzz", "distci.fuzz.command",
            "draw scenario configurations on one cell, run them on its rank pool, shrink what fails"),
)


class CommandImportError(RuntimeError):
    """A registered command module does not import: distci is broken, not the user's input."""


def register(sub: Any, module: str) -> None:
    """Import `module` and let it add its subcommands to `sub`; a module that does not
    import, or has no add_parser, is a CommandImportError naming it."""
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise CommandImportError(f"cannot load the commands of {module}: {exc}") from exc
    add = getattr(mod, "add_parser", None)
    if add is None:
        raise CommandImportError(f"{module} is in distci.cli.COMMANDS but has no add_parser(sub)")
    add(sub)


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names (its first word that is not an option of the hub)."""
    words = iter(argv)
    for word in words:
        if word == "--matrix":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_parser(registry: Sequence[Command] = COMMANDS, load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The hub's parser. `load`: the commands whose modules are imported (their real
    parsers); the others are listed by name and help only. None imports every module."""
    parser = argparse.ArgumentParser(prog="distci", description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="matrix.toml", help="the matrix file (default: matrix.toml)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("matrix", help="list the cells, or print them as a GitHub Actions include list")
    p.add_argument("--json", action="store_true", help="print {'include': [...]} for a GitHub Actions matrix")
    p.add_argument("--tier", default=None)
    p.add_argument("--github-output", action="store_true",
                   help="with --json: also write matrix=, cells=, tier= to $GITHUB_OUTPUT and a step summary")
    p.set_defaults(fn=_cmd_matrix)

    wanted = {c.module for c in registry if load is None or c.name in load}
    for module in dict.fromkeys(c.module for c in registry):
        if module in wanted:
            register(sub, module)
        else:
            for command in (c for c in registry if c.module == module):
                sub.add_parser(command.name, help=command.help)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(load={command_of(argv)} - {None})
    except CommandImportError as exc:
        print(error_text(exc), file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except DistciError as exc:
        print(error_text(exc), file=sys.stderr)
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
