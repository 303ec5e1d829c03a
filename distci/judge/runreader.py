"""Run directories read for ingest: each one parsed, validated and turned into its results
rows, by a reader process beside the writer when there are enough runs to pay for one.

An ingest is per-row work in Python on two sides: reading (every line parsed and checked as
a Result, its row built, the known-issues registry matched) and landing (SQLite, verdicts).
SQLite takes one writer, but reading needs no store at all, so with a second core a reader
process prepares the next runs while the writer lands this one. What crosses the pipe is
what landing needs (rows as tuples of plain values, the run's info, stack, bytes and
hashes), not the Result objects. Fewer than READER_MIN_RUNS runs are read inline, and so is
everything where a process cannot start: the same `prepare` either way, in history order,
at most READ_AHEAD runs ahead (memory holds a few runs, never the history).
"""

from __future__ import annotations

import functools
import hashlib
import multiprocessing
import os
import signal
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from distci.judge.resultrows import plain_text, result_row
from distci.results import Result
from distci.rundir import RunDirError, RunInfo, read_run
from distci.stack import Stack

READER_MIN_RUNS = 8
"""Below this many runs a reader process costs more than it saves (a fork and a pipe for
a run or two): they are read inline."""
READ_AHEAD = 3
"""Runs the reader may have prepared and not yet landed."""
READER_ENV = "DISTCI_INGEST_READER"
"""`inline` reads every run in the ingesting process (no reader process)."""


def load_known_issues(path: Path | None) -> Any:
    """The known-issues registry at `path` (None: no index-time matching)."""
    if path is None:
        return None
    from distci.known_issues import load_registry

    return load_registry(Path(path))  # any mistake in it: a RegistryError, one line naming file:line


def known_issue_of(r: Result, registry: Any) -> str | None:
    """The known issue a Result matches at index time: the one matcher the harness and the
    external runner use (Registry.known_issue_of, through result_known_issue)."""
    from distci.known_issues import result_known_issue

    return result_known_issue(r, registry)


@dataclass
class PreparedRun:
    """One run as landing needs it: its rows are resultrows.result_row's (no verdict yet)."""

    path: Path
    info: RunInfo
    stack: Stack
    raw: bytes
    """results.jsonl's bytes: an updated run's append-only check compares a prefix of them."""
    content_hash: str
    meta_hash: str
    tests: set[str]
    rows: list[tuple]
    problems: list[str]
    """Its bad lines, each as `file:line: why`."""


@dataclass
class Unreadable:
    """A run directory that cannot be read as a run: why, and the bad lines seen on the way."""

    path: Path
    why: str
    problems: list[str]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prepare(d: Path, registry: Any) -> PreparedRun | Unreadable:
    """Reads run directory `d` (rundir.read_run) into what landing it needs."""
    try:
        run = read_run(d)
    except RunDirError as exc:
        return Unreadable(Path(d), str(exc), [str(p) for p in exc.problems])
    except OSError as exc:
        return Unreadable(Path(d), f"{d}: {exc}", [])
    plain = plain_text(run.raw)
    started = run.info.started_at
    rows = [result_row(r, started, known_issue_of(r, registry), plain=plain) for r in run.results]
    # An entry whose search ran out of time (distci.signatures) is named once, here.
    stalled = registry.new_stalls() if registry is not None else []
    return PreparedRun(run.path, run.info, run.stack, run.raw, sha256(run.raw), sha256(run.meta),
                       {r.test_id for r in run.results}, rows, [str(p) for p in run.problems] + stalled)



@functools.lru_cache(maxsize=1)
def _registry_at(known_issues: Path | None) -> Any:
    """The registry as the reader process loads it: once per reader (each ingest starts its own)."""
    return load_known_issues(known_issues)


def _prepare_in_reader(d: Path, known_issues: Path | None) -> PreparedRun | Unreadable:
    return prepare(d, _registry_at(known_issues))


def _die_with(ingest_pid: int) -> None:
    """The reader's initializer: it dies with the ingest that started it, however the ingest
    ends (SIGKILL included), so no reader is left behind under PID 1."""
    from distci.harness import procs

    procs.die_with_parent(signal.SIGKILL)
    if os.getppid() != ingest_pid:  # the ingest died before the death signal was set
        os._exit(1)


def _reader_context() -> Any:
    """fork where the platform has it (no re-import of distci per ingest), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def prepared_runs(dirs: Sequence[Path], registry: Any, known_issues: Path | None) -> Iterator[PreparedRun | Unreadable]:
    """`prepare` of every directory of `dirs`, in their order: by a reader process when there
    are at least READER_MIN_RUNS of them, a second CPU and no DISTCI_INGEST_READER=inline;
    inline otherwise. The reader is stopped when the iteration ends, however it ends."""
    if len(dirs) < READER_MIN_RUNS or (os.cpu_count() or 1) < 2 or os.environ.get(READER_ENV) == "inline":
        for d in dirs:
            yield prepare(d, registry)
        return
    with ProcessPoolExecutor(max_workers=1, mp_context=_reader_context(), initializer=_die_with,
                             initargs=(os.getpid(),)) as reader:
        pending: deque[Future] = deque()
        queue = iter(dirs)
        try:
            for d in queue:
                pending.append(reader.submit(_prepare_in_reader, d, known_issues))
                if len(pending) > READ_AHEAD:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
