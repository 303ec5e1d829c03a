"""`python -m distci.<module>`: one module's subcommand, parsed and run as `python -m distci` does.

The CLI hub (distci/cli.py) imports every command module; a module that offers its own
`python -m` entry uses this instead, so nothing imports the hub.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from distci.errors import DistciError


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
        print(f"distci: error: {exc}", file=sys.stderr)
        return 2
