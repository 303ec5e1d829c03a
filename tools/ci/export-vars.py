#!/usr/bin/env python3
"""Export the named repository variables to the job's later steps, only those that are set.

`env: NAME: ${{ vars.NAME }}` gives NAME an empty value when the repository variable is
unset, and that empty value overrides what the runner's own `.env` file says
(DISTCI_WHEELHOUSE_ROOT, the DISTCI_*BASE_IMAGE variables, ...): the wheelhouse then falls
back into the checkout, which every job cleans. This step reads the whole `vars` context
(VARS, as JSON) and appends to $GITHUB_ENV only the named variables that hold a value,
so an unset repository variable leaves the runner's setting alone.

    VARS='${{ toJSON(vars) }}' tools/ci/export-vars.py DISTCI_INDEX_URL DISTCI_WHEELHOUSE_ROOT ...

Runs on the runner's python3 before anything is installed: standard library only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys

NAME = re.compile(r"^DISTCI_[A-Z0-9_]+$")


def exported(names: list[str], variables: dict[str, object]) -> dict[str, str]:
    """The named variables that hold a non-empty value, in the order named."""
    bad = [n for n in names if not NAME.match(n)]
    if bad:
        raise SystemExit(f"export-vars: {', '.join(bad)}: only DISTCI_* names may be exported")
    return {n: str(variables[n]) for n in names if str(variables.get(n) or "").strip()}


def env_file_lines(values: dict[str, str]) -> list[str]:
    """$GITHUB_ENV lines; the heredoc form, with a delimiter no value contains, for every value."""
    out = []
    for name, value in values.items():
        delimiter = f"EOF_{secrets.token_hex(8)}"
        out += [f"{name}<<{delimiter}", value, delimiter]
    return out


def main(argv: list[str]) -> int:
    raw = os.environ.get("VARS", "")
    try:
        variables = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise SystemExit(f"export-vars: VARS is not JSON ({exc}); give it ${{{{ toJSON(vars) }}}}") from None
    target = os.environ.get("GITHUB_ENV")
    if not target:
        raise SystemExit("export-vars: GITHUB_ENV is not set (not in a GitHub Actions job)")
    values = exported(argv, variables if isinstance(variables, dict) else {})
    with open(target, "a", encoding="utf-8") as fh:
        fh.writelines(line + "\n" for line in env_file_lines(values))
    kept = [n for n in argv if n not in values]
    print(f"exported: {' '.join(values) or 'none'}; left to the runner's environment: {' '.join(kept) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
