"""`python -m distci.bisect ...`: the bisect command alone.

A cell image has distci without its controller dependencies (no Jinja2, no PyGithub), so
`--backend docker` runs this entry inside it instead of the whole CLI.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The bisect command alone (in an image: distci without its controller dependencies)."""
    from distci.bisect.command import add_parser
    from distci.errors import DistciError

    parser = argparse.ArgumentParser(prog="distci")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args: Any = parser.parse_args(["bisect", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.fn(args)
    except DistciError as exc:
        print(f"distci: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
