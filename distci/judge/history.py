"""Since when a failure fails, and what changed: one test's history in one cell, read back.

A failing result began somewhere: the first run of an unbroken stretch of failures with
the same error signature (the first bad run), after the last run where the test passed
(the last good run). What changed between those two runs' stacks, and the upstream
compare range of each package whose commit moved, is what a person bisects or reads
first. The dashboard's cards and release view and the gate's step summary all say it
from here, so they never disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

from distci.judge.store import Store

from distci.judge.rows import ResultRow, RunRow
from distci.judge.verdicts import BLOCKING
from distci.stack import Stack

FAILING = BLOCKING | {"xfail"}
PASSING = frozenset({"pass", "fixed"})
DIFF_KEYS = ("torch", "torch_git", "torchao", "torchtitan", "torch_npu", "triton", "cuda", "nccl", "driver",
             "python", "image_digest")
# Upstream repositories of the packages whose commits a stack can name.
UPSTREAM = {"torch": "pytorch/pytorch", "torchao": "pytorch/ao", "torchtitan": "pytorch/torchtitan"}
GITHUB = "https://github.com"
_GIT_IN_VERSION = re.compile(r"\+git([0-9a-f]{7,40})\b")


@dataclass
class Onset:
    """Where a failure began: its first bad run, the last good one before it, and what changed."""

    first_bad: RunRow | None
    last_good: RunRow | None
    diff: list[tuple[str, str, str]] = field(default_factory=list)  # (key, good, bad)
    compare: list[tuple[str, str]] = field(default_factory=list)  # (label, upstream compare URL)


def stack_diff(good: Stack, bad: Stack) -> list[tuple[str, str, str]]:
    """(key, good value, bad value) for each tracked stack key that differs."""
    out = []
    for key in DIFF_KEYS:
        a, b = good.get(key), bad.get(key)
        if a != b and (a or b):
            out.append((key, str(a if a is not None else "–"), str(b if b is not None else "–")))
    return out


def package_commit(stack: Stack, package: str) -> str | None:
    """The upstream commit a stack names for a package: torch's git_version, a `<pkg>_git`
    key, or a `+git<sha>` local version (source installs)."""
    value = stack.get(f"{package}_git")
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{7,40}", value):
        return value
    m = _GIT_IN_VERSION.search(str(stack.get(package) or ""))
    return m.group(1) if m else None


def compare_urls(good: Stack, bad: Stack) -> list[tuple[str, str]]:
    """`compare/<good>...<bad>` on GitHub for each upstream package whose commit changed."""
    out = []
    for package, repo in UPSTREAM.items():
        a, b = package_commit(good, package), package_commit(bad, package)
        if a and b and a != b:
            out.append((f"{package} {a[:10]}…{b[:10]}", f"{GITHUB}/{repo}/compare/{a}...{b}"))
    return out


def test_history(store: Store, cell_id: str, test_id: str) -> Iterator[ResultRow]:
    """One test's results in one cell, newest first, read as the caller walks back (a
    failure's first bad run is usually a few runs back, not a year)."""
    runs = store.conn.execute(
        "SELECT run_id FROM runs WHERE cell_id = ? ORDER BY started_at DESC, run_id DESC", (cell_id,)).fetchall()
    for (run_id,) in runs:  # runs_by_cell, then the results primary key: one probe per run walked
        row = store.conn.execute("SELECT * FROM results WHERE run_id = ? AND test_id = ?", (run_id, test_id)).fetchone()
        if row is not None:
            yield store._result_row(row)


def first_bad(newest_first: Iterable[ResultRow], r: ResultRow) -> tuple[ResultRow, ResultRow | None]:
    """In one test's results of one cell, newest first, the result where `r`'s failure began
    (same signature, unbroken) and the pass just before it (None: no pass before).

    The walk starts at `r` and stops at the first result that breaks the run, so given
    test_history (read as it goes) a year of history costs the length of the failure."""
    first, good = r, None
    older = False
    for prev in newest_first:
        if not older:
            older = prev.run_id == r.run_id
            continue
        if prev.verdict in FAILING and prev.error_signature == r.error_signature:
            first = prev
            continue
        if prev.verdict in PASSING:
            good = prev
        break
    return first, good


def onset(store: Store, r: ResultRow, *, runs: Mapping[str, RunRow] | None = None) -> Onset:
    """The Onset of a failing result, from its test's history in its cell (newest first, read
    as far as the failure goes); `runs` (run id -> RunRow) spares the run queries."""
    first, good = first_bad(test_history(store, r.cell_id, r.test_id), r)

    def run(run_id: str) -> RunRow | None:
        return runs.get(run_id) if runs is not None else store.run(run_id)

    bad_run, good_run = run(first.run_id), run(good.run_id) if good else None
    if bad_run is None or good_run is None:
        return Onset(bad_run, good_run)
    return Onset(bad_run, good_run, stack_diff(good_run.stack, bad_run.stack),
                 compare_urls(good_run.stack, bad_run.stack))
