"""Rank the commits of a range that bisect could not split, by the failing traceback.

When skipped commits leave a range instead of one culprit, the commits that touched a
file the failing traceback runs through are the ones to read first. Frames nearer the
error weigh more (the top of a traceback is mostly the test runner); a commit touching
only a sibling of a frame's file scores a little, one touching nothing the failure ran
through scores zero and keeps its place at the end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Iterable, Sequence

ROOTS = ("torch", "functorch", "torchao", "torchtitan", "torch_npu")
SIBLING_WEIGHT = 0.25

_PYTHON_FRAME = re.compile(r'File "([^"]+)", line \d+')
_PYTEST_FRAME = re.compile(r"^([^\s:]+\.py):\d+:", re.MULTILINE)


@dataclass(frozen=True)
class Suspect:
    commit: str
    subject: str
    score: float
    shared: tuple[str, ...]
    siblings: tuple[str, ...]


def traceback_files(text: str, roots: Sequence[str] = ROOTS) -> list[str]:
    """Repository paths of the frames in a traceback, outermost first, without repeats.

    ``.../site-packages/torch/distributed/tensor/_api.py`` becomes
    ``torch/distributed/tensor/_api.py``; frames outside `roots` (the test, pytest) are
    dropped.
    """
    found: list[tuple[int, str]] = []
    for pattern in (_PYTHON_FRAME, _PYTEST_FRAME):
        found += [(m.start(), m.group(1)) for m in pattern.finditer(text)]
    paths: list[str] = []
    for _, raw in sorted(found):
        path = _repo_path(raw.replace("\\", "/"), roots)
        if path and path not in paths:
            paths.append(path)
    return paths


def rank_suspects(commits: Iterable[tuple[str, str, Iterable[str]]], traceback: str,
                  roots: Sequence[str] = ROOTS) -> list[Suspect]:
    """`commits` as (sha, subject, files changed); best suspect first, stable on ties."""
    frames = traceback_files(traceback, roots)
    weight = {path: 1.0 + i / max(len(frames), 1) for i, path in enumerate(frames)}
    folders = {str(PurePosixPath(p).parent): w for p, w in weight.items()}
    suspects = []
    for commit, subject, files in commits:
        files = list(files)
        shared = tuple(f for f in files if f in weight)
        siblings = tuple(f for f in files if f not in weight
                         and str(PurePosixPath(f).parent) in folders)
        score = sum(weight[f] for f in shared) + SIBLING_WEIGHT * sum(
            folders[str(PurePosixPath(f).parent)] for f in siblings)
        suspects.append(Suspect(commit, subject, round(score, 3), shared, siblings))
    return sorted(suspects, key=lambda s: -s.score)


def _repo_path(path: str, roots: Sequence[str]) -> str | None:
    """From an installed package (after site-packages), else from the last root in a
    checkout path; None outside the roots."""
    parts = path.split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            rest = parts[len(parts) - parts[::-1].index(marker):]
            return "/".join(rest) if len(rest) > 1 and rest[0] in roots else None
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in roots:
            return "/".join(parts[i:])
    return None
