"""`python -m distci.<module>`: one module's subcommand, parsed and run as `python -m distci` does.

The CLI hub (distci/cli.py) imports every command module; a module that offers its own
`python -m` entry uses this instead, so nothing imports the hub.

The exit file is here too, the one record every command may leave for CI:
nox ends every failed session with exit 1, so `nox -s gate` cannot tell a CI step
whether the gate said BLOCKED (1) or INCOMPLETE (3), nor `nox -s dist_tests` whether a
test failed (1) or only infrastructure did (3). Given DISTCI_EXIT_FILE, `python -m
distci run` and `gate` (and any command that ends in a usage error, 2) write

    {"command": "gate", "exit_code": 3, "meaning": "INCOMPLETE: ...", ...}

there; the noxfile points it at `.nox/distci-exit.json` and names the code in the
session's failure line. A workflow step reads it with `if: always()`:

    jq -r .exit_code .nox/distci-exit.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from distci.errors import DistciError, error_text


def run_module(add_parser: Callable[[Any], Any], argv: Sequence[str] | None = None) -> int:
    """Build a parser holding only the subcommand(s) `add_parser` registers, run the first."""
    parser = argparse.ArgumentParser(prog="distci")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    name = next(iter(sub.choices))
    args = parser.parse_args([name, *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.fn(args)
    except DistciError as exc:
        print(error_text(exc), file=sys.stderr)
        return 2


EXIT_FILE_ENV = "DISTCI_EXIT_FILE"


def write_exit_file(command: str, code: int, meaning: str, path: Path | str | None = None, **extra: Any) -> Path | None:
    """Writes the exit file at `path` (default: $DISTCI_EXIT_FILE; neither: nothing); returns it.

    Written to a temporary name and renamed, so a reader never sees half a file."""
    target = path or os.environ.get(EXIT_FILE_ENV)
    if not target:
        return None
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({"command": command, "exit_code": code, "meaning": meaning, **extra}, indent=1) + "\n")
    os.replace(tmp, target)
    return target
