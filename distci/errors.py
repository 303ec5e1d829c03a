"""The error types users see.

One type per user mistake. Each carries where the mistake is (a file and, where known,
a line or key) so the CLI can print one line that says what to change.
"""

from __future__ import annotations

import shutil
import sys
import textwrap


class DistciError(Exception):
    """Base of every error distci reports to a user as one line (no traceback)."""

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class MatrixError(DistciError):
    """matrix.toml is invalid: an unknown key, a bad specifier, a rule matching nothing."""


class RegistryError(DistciError, ValueError):
    """The known-issues registry is invalid: a wrong type, a missing or unknown key, a duplicate
    id, a signature that could stall a run. The message names the file:line, entry and key."""


class SourceError(DistciError):
    """A Source cannot be resolved (no such version, index not configured, bad spec)."""


class ConfigError(DistciError):
    """A configuration value (environment variable, config file) is missing or invalid."""


class InfraError(DistciError):
    """The environment, image or device could not be brought up: verdict `infra`.

    Never a regression: the run records an `infra` result carrying the partial stack and
    the log instead of test outcomes.
    """

    def __init__(self, message: str, *, where: str | None = None, log: str = "") -> None:
        self.log = log
        super().__init__(message, where=where)


class SelectionError(DistciError):
    """A --cell / --tier / --test selection names nothing in the matrix."""


class StoreError(DistciError):
    """A run artifact is malformed, or contradicts what the store already indexed for it."""


class BisectError(DistciError):
    """A bisect cannot start or go on: endpoints that agree, a bad state file, a range
    that is not a chain of commits. The message says what to change."""


class FuzzSpecError(DistciError):
    """A fuzz command's --space, --budget or --replay value is not one the space can take."""


def error_text(error: BaseException, *, prefix: str = "distci: error: ", width: int | None = None) -> str:
    """How a user error reads on stderr: `distci: error: <what>`.

    Read by a person (stderr a terminal), it is wrapped at spaces to the terminal's width
    ($COLUMNS, else the terminal's) with continuation lines indented, so no line is wider
    than the screen (a path or URL longer than a line stays whole). Read by a program (a
    pipe, a CI log's grep) it stays the one line that names the bad input."""
    if width is None:
        if not _stderr_is_a_terminal():
            return f"{prefix}{error}"
        width = max(40, shutil.get_terminal_size((80, 24)).columns)
    lines: list[str] = []
    for n, paragraph in enumerate(f"{prefix}{error}".splitlines() or [prefix.rstrip()]):
        lines += textwrap.wrap(paragraph, width, initial_indent="" if n == 0 else "    ",
                               subsequent_indent="    ", break_long_words=False, break_on_hyphens=False) or [""]
    return "\n".join(lines)


def _stderr_is_a_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
