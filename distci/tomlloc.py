"""Where in a TOML file a section or key is: the file:line of matrix.toml's one-line errors.

tomllib gives values, not positions, so an error about ``[[matrix]] #3: torch = ...``
would name no line; the Locator finds it in the raw text, and `suggest` adds the "did you
mean" hint. Split out of distci.matrix, which uses both for every error it raises.

Why not tomlkit: it keeps a document's formatting but exposes no source position for a
table or key (checked with tomlkit 0.15: its items carry trivia, no line), so finding the
line would still need this scan over the text; values come from the standard library's
tomllib, which needs no dependency inside cell environments.
"""

from __future__ import annotations

import difflib
import functools
import re
import sys
from pathlib import Path
from typing import Any, Iterable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from distci.errors import DistciError, MatrixError


def read(path: Path, *, kind: type[DistciError], max_bytes: int, missing: str) -> tuple[dict[str, Any], "Locator"]:
    """A TOML file read at the edge: its data and a Locator over its text. Too big, missing
    (`missing` says what to do), unreadable, not UTF-8, not TOML or nested past the parser:
    each is one `kind` error naming the file (and the line, where TOML names one)."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise kind(f"{size} bytes is too big for this file (at most {max_bytes}); {missing}", where=str(path))
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise kind(f"file not found; {missing}", where=str(path)) from None
    except OSError as exc:
        raise kind(f"cannot read it ({exc.strerror or exc})", where=str(path)) from None
    except UnicodeDecodeError as exc:
        raise kind(f"not UTF-8 text ({exc.reason} at byte {exc.start})", where=str(path)) from None
    try:
        return tomllib.loads(text), Locator(path, text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"at line (\d+)", str(exc))
        raise kind(f"invalid TOML: {exc}", where=f"{path}:{line.group(1)}" if line else str(path)) from None
    except RecursionError:
        raise kind("invalid TOML: nested deeper than the parser goes", where=str(path)) from None


def suggest(word: str, allowed: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class Locator:
    """Finds the line of a section or key in the raw TOML text, for error messages."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    @functools.cached_property
    def _headers(self) -> list[tuple[int, str, bool]]:
        """Every section header once per file: a registry's load asks for one entry's lines per
        entry, and a scan per question made loading the registry quadratic in its size."""
        found = []
        for number, line in enumerate(self.lines, 1):
            match = re.match(r"\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$", line)
            if match:
                name = re.sub(r"\s*\.\s*", ".", match.group(2)).replace('"', "").replace("'", "")
                found.append((number, name, match.group(1) == "[["))
        return found

    def section(self, name: str, index: int = 0) -> tuple[int, int] | None:
        """(first, last) line numbers of the index-th ``[name]`` / ``[[name]]`` section."""
        headers = self._headers
        hits = [i for i, (_, n, _) in enumerate(headers) if n == name]
        if index >= len(hits):
            return None
        i = hits[index]
        start = headers[i][0]
        end = headers[i + 1][0] - 1 if i + 1 < len(headers) else len(self.lines)
        return start, end

    def line_of(self, section: tuple[str, int] | None, key: str | None) -> int | None:
        pattern = re.compile(rf"(^|[\s{{,])[\"']?{re.escape(key)}[\"']?\s*=") if key else None
        headers = self._headers
        if section is None:
            if key is None:
                return None
            first, last = 1, (headers[0][0] - 1 if headers else len(self.lines))
        else:
            span = self.section(*section)
            if span is None:
                return None
            first, last = span
            if key is None:
                return first
        for number in range(first, last + 1):
            if pattern.search(self.lines[number - 1].split("#", 1)[0]):
                return number
        if section is None:
            for number, name, _ in headers:
                if name == key or name.startswith(key + "."):
                    return number
            return None
        return first

    def entry_line(self, array: str, index: int, key: str | None = None, table: str | None = None) -> int | None:
        """The line of `key` in the index-th ``[[array]]`` entry (in its ``[array.table]``
        sub-table, or its inline ``table = {...}``, when `table` is given); the entry's header
        line when the key is not found there."""
        headers = self._headers
        starts = [i for i, (_, name, double) in enumerate(headers) if double and name == array]
        if index >= len(starts):
            return None
        first = headers[starts[index]][0]
        following = [n for n, name, _ in headers[starts[index] + 1:] if not name.startswith(array + ".")]
        last = following[0] - 1 if following else len(self.lines)
        if key is None:
            return first
        if table is not None:
            sub = [n for n, name, _ in headers if first < n <= last and name == f"{array}.{table}"]
            if sub:
                found = self._find_key(key, sub[0], last)
                return found or sub[0]
            found = self._find_key(table, first, last)
            return found or first
        nested = [n for n, name, _ in headers if first < n <= last]
        return self._find_key(key, first, nested[0] - 1 if nested else last) or first

    def _find_key(self, key: str, first: int, last: int) -> int | None:
        pattern = re.compile(rf"(^|[\s{{,])[\"']?{re.escape(key)}[\"']?\s*=")
        for number in range(first, last + 1):
            if pattern.search(self.lines[number - 1].split("#", 1)[0]):
                return number
        return None

    def where(self, line: int | None) -> str:
        """`file:line`, or the file alone where the line is not known."""
        return f"{self.path}:{line}" if line else str(self.path)

    def error(self, message: str, section: tuple[str, int] | None = None, key: str | None = None,
              *, kind: type[DistciError] = MatrixError) -> DistciError:
        """A one-line error of type `kind` (MatrixError by default) at the section or key's line."""
        return kind(message, where=self.where(self.line_of(section, key)))
