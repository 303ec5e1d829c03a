"""The infra record of a run whose environment never came up: the partial stack it carries
and the one Result that says why (DESIGN rule 2: no result without its cell and stack).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from distci.cells import Cell
from distci.results import Result, error_signature
from distci.rundir import INFRA_PREFIX, now, repro_line
from distci.stack import KEYS as STACK_KEYS
from distci.stack import Stack


def partial_stack(cell: Cell, **extra: Any) -> Stack:
    """The provenance an infra record carries when the environment never came up."""
    known = {k: v for k, v in extra.items() if k in STACK_KEYS}
    stack = Stack(partial=True, declared=cell.as_dict(), python=sys.version.split()[0],
                  runner=os.environ.get("DISTCI_RUNNER") or socket.gethostname(), **known)
    stack.extra.update({k: v for k, v in extra.items() if k not in STACK_KEYS})
    return stack


def infra_result(run_id: str, cell: Cell, exc: Exception, log_path: Path | None, *,
                 test_id: str | None = None, stack: Stack | None = None) -> Result:
    """An `infra` Result: for the whole cell (`<infra>::<cell id>`), or for `test_id` (one
    external suite) when given. Rule 2 of the design: it carries the cell id, a stack (the
    captured one when the environment came up, else the partial one) and the log's tail."""
    exc_type, message = type(exc).__name__, str(exc)
    return Result(
        run_id=run_id,
        cell_id=cell.id,
        test_id=test_id or f"{INFRA_PREFIX}{cell.id}",
        outcome="error",
        failure_kind="infra",
        error_signature=error_signature(exc_type, message),
        message=f"{exc_type}: {message}\n{getattr(exc, 'log', '') or ''}"[:20000],
        stack=stack if stack is not None else partial_stack(cell, error=message),
        repro=repro_line(cell.id, test_id),
        started_at=now(),
        log_path=str(log_path) if log_path else "",
    )
