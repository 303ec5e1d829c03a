"""Error signatures (the known-issues registry's regexes) that no pattern can turn into a stall.

A signature is searched in every failure's message, inside the cell's pytest process and
again at ingest. Python's `re` backtracks: `(a+)+$` against forty a's and a `b` runs for
hours, and a registry entry written that way would stop every run and every ingest. Two
guards, so a pattern is refused early and a pattern that slips through is still bounded:

1. `compile_signature` refuses, at load, what backtracks catastrophically by construction:
   a repeated group whose body repeats too (`(a+)+`, `(\\w+\\s?)*`, `(.*x){20}`), a
   backreference, and a pattern that matches the empty text (it would explain every failure).
2. `search` runs under a time bound (`SEARCH_BUDGET_S`) and says `None` when it ran out.
   The engine: the `regex` package where it is installed (the controller's dependency: the
   same syntax as `re`, a per-call `timeout`, thread-safe, no signals; RE2 was the other
   candidate, but it refuses look-arounds the registry may use and would give a pattern two
   meanings, RE2's on the controller and `re`'s in cells). Cell environments stay
   stdlib + pytest + torch, so there `re` runs under a SIGALRM interval timer (the `re`
   engine checks for signals while it backtracks) on the main thread; off the main thread,
   or while someone else's timer is set, the text is cut to `UNTIMED_TEXT_CHARS` and guard 1
   is what holds. A search that ran out explains nothing: a failure stays a failure.
"""

from __future__ import annotations

import functools
import re
import signal
import sys
import threading
from typing import Any

if sys.version_info >= (3, 11):
    import re._parser as _sre_parse  # type: ignore[import-not-found]
    import re._constants as _sre_const  # type: ignore[import-not-found]
else:  # pragma: no cover
    import sre_constants as _sre_const
    import sre_parse as _sre_parse

try:  # the controller's engine; absent in cell environments
    import regex as _regex  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - depends on the environment
    _regex = None

SEARCH_BUDGET_S = 1.0
"""Seconds one search may take. A real signature needs microseconds on a 100 KB message."""
TEXT_CHARS = 1 << 20
"""Characters of a message searched at most (a failure message beyond 1 MiB is cut)."""
UNTIMED_TEXT_CHARS = 1 << 16
"""Characters searched where no timer can bound the search."""

_REPEATS = {_sre_const.MAX_REPEAT, _sre_const.MIN_REPEAT} | (
    {_sre_const.POSSESSIVE_REPEAT} if hasattr(_sre_const, "POSSESSIVE_REPEAT") else set())
_UNBOUNDED = _sre_const.MAXREPEAT


class SearchTimeout(Exception):
    """A search ran past its budget (raised by the SIGALRM handler, caught here)."""


def _children(op: Any, av: Any) -> list[Any]:
    """The sub-patterns of one parsed node (a list of (op, av) sequences)."""
    if op in _REPEATS:
        return [av[2]]
    if op is _sre_const.SUBPATTERN:
        return [av[-1]]
    if op is _sre_const.BRANCH:
        return list(av[1])
    if op in (_sre_const.ASSERT, _sre_const.ASSERT_NOT):
        return [av[1]]
    if getattr(_sre_const, "ATOMIC_GROUP", None) is op:
        return [av]
    if op is _sre_const.GROUPREF_EXISTS:
        return [p for p in av[1:] if p is not None]
    return []


def _has_repeat(nodes: Any) -> bool:
    for op, av in nodes:
        if op in _REPEATS and av[1] > 1:
            return True
        if any(_has_repeat(child) for child in _children(op, av)):
            return True
    return False


def _danger(nodes: Any) -> str | None:
    """Why a parsed pattern can backtrack without end, or None."""
    for op, av in nodes:
        if op is _sre_const.GROUPREF or op is _sre_const.GROUPREF_EXISTS:
            return "it uses a backreference (matching those can take exponential time)"
        if op in _REPEATS and av[1] > 1 and _has_repeat(av[2]):
            return ("it repeats a group that itself repeats (like `(a+)+` or `(.*x){20}`), which backtracks "
                    "without end on a text that almost matches; write the repeated part once")
        for child in _children(op, av):
            why = _danger(child)
            if why:
                return why
    return None


@functools.lru_cache(maxsize=4096)
def compile_signature(text: str) -> re.Pattern[str]:
    """The compiled pattern; ValueError saying why it is refused (invalid, catastrophic, empty).

    Cached (a refusal is not, it raises): every registry load checks every signature again,
    and parsing them for `_danger` was most of a load (36,000 calls in the quick tier,
    2026-12-07). A compiled pattern is immutable."""
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise ValueError(f"is not a valid regex: {exc}") from None
    why = _danger(_sre_parse.parse(text))
    if why:
        raise ValueError(f"is refused: {why}")
    if pattern.search("") is not None:
        raise ValueError("matches an empty message, so it would explain every failure; make it name the error")
    return pattern


def required_words(pattern: str) -> list[str]:
    """The whole words every match of `pattern` contains: what the pattern itself says, never
    what a wildcard happened to match (a parameter's name in `[a-z.]+`). A word touching
    anything but literal text (a class, a wildcard, an optional part, a nested alternation,
    whose common prefix the parser factors out) may be a fragment and is left out."""
    gap = "\0"

    def walk(nodes: Any) -> str:
        out = []
        for op, av in nodes:
            if op is _sre_const.LITERAL:
                out.append(chr(av))
            elif op is _sre_const.SUBPATTERN:
                out.append(walk(av[-1]))
            elif op in (_sre_const.MAX_REPEAT, _sre_const.MIN_REPEAT) and av[0] >= 1:
                out.append(gap + walk(av[2]) + gap)
            else:
                out.append(gap)
        return "".join(out)
    text = walk(_sre_parse.parse(pattern))
    return [m.group(0) for m in re.finditer(r"\w+", text)
            if text[m.start() - 1:m.start()] != gap and text[m.end():m.end() + 1] != gap]


def alternatives(pattern: str) -> list[str]:
    """The top-level alternatives of a regex source (`a|(b|c)|[|]` -> `a`, `(b|c)`, `[|]`)."""
    parts, depth, start, in_class, i = [], 0, 0, False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 1
        elif in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 2 if pattern.startswith("^]", i + 1) else 1 if pattern.startswith("]", i + 1) else 0  # `[]x]`
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    return [*parts, pattern[start:]]


_compiled: dict[tuple[str, int], Any] = {}


def _regex_of(pattern: re.Pattern[str]) -> Any:
    key = (pattern.pattern, pattern.flags)
    if key not in _compiled:
        _compiled[key] = _regex.compile(pattern.pattern, pattern.flags & ~re.UNICODE)
    return _compiled[key]


def _on_alarm(signum: int, frame: Any) -> None:
    raise SearchTimeout()


def _timed_re(pattern: re.Pattern[str], text: str, budget_s: float) -> bool | None:
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, budget_s)
        try:
            return pattern.search(text) is not None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except SearchTimeout:
        return None
    finally:
        signal.signal(signal.SIGALRM, previous)


def search(pattern: re.Pattern[str], text: str, budget_s: float = SEARCH_BUDGET_S) -> bool | None:
    """Whether `pattern` is found in `text`; None when the search ran out of `budget_s`."""
    text = text[:TEXT_CHARS]
    if _regex is not None:
        try:
            return _regex_of(pattern).search(text, timeout=budget_s) is not None
        except TimeoutError:
            return None
    timer_free = hasattr(signal, "setitimer") and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    if timer_free and threading.current_thread() is threading.main_thread():
        return _timed_re(pattern, text, budget_s)
    return pattern.search(text[:UNTIMED_TEXT_CHARS]) is not None
