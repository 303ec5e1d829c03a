"""DISTCI_FIXES for a cell run: it overrides the cells' fixes mode, or is refused.

Inside a cell env DISTCI_FIXES picks fixes by id (fixes/distci_fixes/selection.py). A cell
run records its fixes mode in the cell id (`fix_on` / `fix_off`), so only `all` and `none`
can override it there without a run joining the other mode's history.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from distci.cells import Cell
from distci.errors import ConfigError

FIXES_ENV = "DISTCI_FIXES"
_FIXES_MODES = {"all": "on", "none": "off"}


def fixes_override(cells: list[Cell], environ: Mapping[str, str] = os.environ) -> list[Cell]:
    """The cells as $DISTCI_FIXES asks a run to take them: `all` / `none` override each
    cell's fixes mode, and so its id's fixes part (`fix_on` / `fix_off`), its cell env's
    DISTCI_FIXES and its Stack's fixes: the run never joins the other mode's history.
    A list of ids is refused: a cell run applies all its fixes or none (that is what its id
    records), and an unknown id must never run as if it were a fix."""
    raw = (environ.get(FIXES_ENV) or "").strip()
    if not raw:
        return cells
    mode = _FIXES_MODES.get(raw.lower())
    if mode is None:
        raise ConfigError(
            f"{raw!r}: a cell run takes `all` or `none` (the cell's fixes mode, recorded in its id), not fix ids; "
            f"unset {FIXES_ENV} to use each cell's declared mode, or run pytest in the cell's environment with "
            f"{FIXES_ENV}=id1,id2 (ids are checked there)", where=FIXES_ENV)
    chosen: dict[str, Cell] = {}
    for cell in cells:
        moved = cell if cell.fixes == mode else dataclasses.replace(cell, fixes=mode)
        chosen.setdefault(moved.id, moved)  # a cell and its twin collapse into one run
    return list(chosen.values())
