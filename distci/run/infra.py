"""The infra record of a run whose environment never came up: the partial stack it carries
and the one Result that says why (DESIGN rule 2: no result without its cell and stack).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from distci.cells import Cell
from distci.results import Result
from distci.rundir import infra_result as _infra_result
from distci.stack import KEYS as STACK_KEYS
from distci.stack import Stack


def partial_stack(cell: Cell, **extra) -> dict:
    """The provenance an infra record carries when the environment never came up."""
    known = {k: v for k, v in extra.items() if k in STACK_KEYS}
    stack = Stack(partial=True, declared=cell.as_dict(), python=sys.version.split()[0],
                  runner=os.environ.get("DISTCI_RUNNER") or socket.gethostname(), **known)
    stack.extra.update({k: v for k, v in extra.items() if k not in STACK_KEYS})
    return stack.to_dict()


def infra_result(run_id: str, cell: Cell, exc: Exception, log_path: Path | None, *,
                 test_id: str | None = None, stack: dict | None = None) -> Result:
    """An `infra` Result: for the whole cell, or for `test_id` (one external suite) when given.

    `stack` is the captured Stack when the environment did come up; otherwise the partial one.
    """
    return _infra_result(run_id, cell.id, str(exc), exc_type=type(exc).__name__, log=getattr(exc, "log", "") or "",
                         stack=stack if stack is not None else partial_stack(cell, error=str(exc)),
                         test_id=test_id, log_path=log_path)
