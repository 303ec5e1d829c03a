"""A change of one file between two builds, as pydiff.py searches it: hunks, and the
one-line edits a hunk is narrowed by.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class Hunk:
    """One change of a file: good lines [a0, a1) become the bad build's `new` lines."""

    path: str
    a0: int
    a1: int
    old: tuple[str, ...]
    new: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.path}:{self.a0 + 1}"

    def unified(self) -> str:
        """The hunk as a diff; lines both sides keep (a narrowed hunk's) are context."""
        head = f"@@ {self.path} -{self.a0 + 1},{self.a1 - self.a0} @@\n"
        body = []
        for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, self.old, self.new, autojunk=False).get_opcodes():
            if tag == "equal":
                body += [f" {line}" for line in self.old[a0:a1]]
                continue
            body += [f"-{line}" for line in self.old[a0:a1]] + [f"+{line}" for line in self.new[b0:b1]]
        return head + "".join(line if line.endswith("\n") else line + "\n" for line in body)

    def trimmed(self) -> "Hunk":
        """The same change without the lines both sides share at its start and end."""
        old, new, a0 = list(self.old), list(self.new), self.a0
        while old and new and old[0] == new[0]:
            old.pop(0), new.pop(0)
            a0 += 1
        a1 = a0 + len(old)
        while old and new and old[-1] == new[-1]:
            old.pop(), new.pop()
            a1 -= 1
        return Hunk(self.path, a0, a1, tuple(old), tuple(new))

    def search_terms(self) -> list[str]:
        """Lines worth `git log -S`: the longest distinctive changed lines, stripped."""
        lines = {line.strip() for line in (*self.new, *self.old)}
        lines = {line for line in lines if len(line) > 8 and not line.startswith("#")}
        return sorted(lines, key=lambda line: (-len(line), line))[:2]


def hunks_of(path: str, good: Path, bad: Path) -> list[Hunk]:
    old = good.read_text(errors="replace").splitlines(keepends=True)
    new = bad.read_text(errors="replace").splitlines(keepends=True)
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    return [Hunk(path, a0, a1, tuple(old[a0:a1]), tuple(new[b0:b1]))
            for tag, a0, a1, b0, b1 in ops if tag != "equal"]


def apply_hunks(good_text: str, hunks: Sequence[Hunk]) -> str:
    """`good_text` with `hunks` (all of one file, from hunks_of) applied."""
    lines = good_text.splitlines(keepends=True)
    for hunk in sorted(hunks, key=lambda h: h.a0, reverse=True):
        lines[hunk.a0:hunk.a1] = list(hunk.new)
    return "".join(lines)


@dataclass(frozen=True)
class LineEdit:
    """One edit inside a hunk: old line `i` becomes new line `j` (a pair of similar lines),
    old line `i` goes (j None), or new line `j` comes (i None)."""

    i: int | None
    j: int | None

    def name(self, hunk: Hunk) -> str:
        return f"-{hunk.a0 + self.i + 1}" if self.j is None else f"+{hunk.a0 + (self.i or 0) + 1}" if (
            self.i is None) else f"~{hunk.a0 + self.i + 1}"


PAIR_RATIO = 0.5  # lines this alike are one edit: a changed line, not a deletion and an addition


def line_edits(hunk: Hunk) -> list[LineEdit]:
    """A hunk split into one-line edits, in order. An old line and the new line most like it
    (in order, ratio >= PAIR_RATIO) are one edit, so a narrowed answer never reads as "this
    line deleted" when the line was changed."""
    pairs: dict[int, int] = {}
    start = 0
    for i, line in enumerate(hunk.old):
        scored = [(difflib.SequenceMatcher(None, line, hunk.new[j]).ratio(), j) for j in range(start, len(hunk.new))]
        best = max(scored, default=(0.0, -1), key=lambda rj: (rj[0], -rj[1]))
        if best[0] >= PAIR_RATIO:
            pairs[i], start = best[1], best[1] + 1
    edits, nj = [], 0
    for i in range(len(hunk.old)):
        if i in pairs:
            edits += [LineEdit(None, j) for j in range(nj, pairs[i])]
            edits.append(LineEdit(i, pairs[i]))
            nj = pairs[i] + 1
        else:
            edits.append(LineEdit(i, None))
    return edits + [LineEdit(None, j) for j in range(nj, len(hunk.new))]


def apply_edits(hunk: Hunk, edits: Sequence[LineEdit]) -> Hunk:
    """The part of `hunk` that `edits` (from line_edits) make, over the hunk's whole span."""
    chosen = set(edits)
    block: list[str] = []
    for edit in line_edits(hunk):
        if edit.i is None:
            block += [hunk.new[edit.j]] if edit in chosen else []
        elif edit.j is None:
            block += [] if edit in chosen else [hunk.old[edit.i]]
        else:
            block.append(hunk.new[edit.j] if edit in chosen else hunk.old[edit.i])
    return Hunk(hunk.path, hunk.a0, hunk.a1, hunk.old, tuple(block))
