"""Coverage: what the store holds for one cell the gate expects, judged test by test.

A cell's expected tests are those of its latest *complete* run (ended, not narrowed by
`-k` / `--test`, of a covering tier, some test ran), plus any test a later run added. A
tier run as N shards (`distci run --shard K/N`, one job each) is complete once the latest
ended run of every share 1..N is there: their tests together are the expected ones, and
the walk starts at the oldest of them. Each
is judged by its latest result since that run; an infra result is not a result of the
test and never replaces one, so a narrowed rerun adds evidence and never hides a failure
it did not re-run. A test with no result on the current stack (that of the latest run
that ran a test) is missing. distci.judge.gate turns these CellStates into its answer.

The fuzzer's configurations (`rows.is_fuzz`) are judged, never expected: a configuration
drawn one night is not drawn the next, so its absence never makes a cell partial, and a
fuzz run (only fuzz results) never is the complete run the expected tests come from. A
failing one blocks like any test (verdict `fail` or `regression`), and it keeps blocking
after the next complete run, on the stack it failed on, until a later result of the same
configuration says otherwise (a replay: its test id names it) or the stack moves on: a
find must not vanish because the next night drew other configurations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Sequence

from distci.errors import SelectionError
from distci.judge.store import Store
from distci.judge.rows import FUZZ_PREFIXES, ResultRow, RunRow, is_environment, is_fuzz
from distci.judge.verdicts import BLOCKING, env_key
from distci.results import is_interruption
from distci.rundir import Selection

DEFAULT_MAX_AGE = timedelta(hours=36)


@dataclass
class CellState:
    """What the store holds for one cell the gate expects (states: see the module doc)."""

    cell_id: str
    state: str
    last_run: RunRow | None = None
    age_s: float | None = None
    torch_version: str | None = None
    torch_git: str | None = None
    reason: str = ""
    missing_tests: list[str] = field(default_factory=list)
    """Expected tests with no result on the current stack (state `partial`)."""
    evidence_runs: list[str] = field(default_factory=list)
    """The runs whose results the gate judged this cell by, oldest first."""

    def to_text(self) -> str:
        if self.last_run is None:
            return f"{self.cell_id}: {self.state} ({self.reason})"
        age = f"{self.age_s / 3600:.1f} h ago" if self.age_s is not None else "age unknown"
        return (
            f"{self.cell_id}: {self.state}  last run {self.last_run.started_at or '?'} ({age})  "
            f"torch {self.torch_version or '?'}  git {self.torch_git or '?'}  run {self.last_run.run_id}"
            + (f"  ({self.reason})" if self.reason else "")
        )


def judge_cell(
    store: Store, cell: str, tier: str, *, now: datetime, max_age: timedelta = DEFAULT_MAX_AGE,
    covering_tiers: Sequence[str] = (),
) -> tuple[CellState, list[ResultRow]]:
    """One cell's state and the results it is judged by: each test's latest result since
    the cell's latest complete run of `tier` (infra only where the test has nothing else)."""
    runs = store.runs(cell_id=cell)
    if not runs:
        return CellState(cell, "missing", reason="no run of this cell in the store"), []
    last = runs[-1]
    results: dict[str, list[ResultRow]] = {}

    def rows_of(run: RunRow) -> list[ResultRow]:  # read as the walk back needs them: a year is not read
        if run.run_id not in results:
            results[run.run_id] = store.results(run_id=run.run_id)
        return results[run.run_id]

    tiers = {tier, "", *covering_tiers}
    base, members = _latest_base(runs, tiers, rows_of)
    since = runs[runs.index(base):] if base is not None else runs
    latest: dict[str, ResultRow] = {}
    on_stack: dict[str, set[str]] = {}
    current_env: str | None = None
    current_run = ""
    for run in since:
        env = env_key(run.stack)
        rows = rows_of(run)
        if any(_ran(r) for r in rows):
            current_env, current_run = env, run.run_id
        for r in rows:
            if r.verdict == "infra" and r.test_id in latest and latest[r.test_id].verdict != "infra":
                continue  # not a result of the test: it never replaces one
            latest[r.test_id] = r
            if r.verdict != "infra":
                on_stack.setdefault(r.test_id, set()).add(env)
    carried: dict[str, ResultRow] = {}
    for run in reversed(runs[:runs.index(base)] if base is not None else []):
        if env_key(run.stack) != current_env:
            break  # the stack moved on: older finds were of another stack (and a year is not read)
        # an earlier fuzz result on this stack: the latest of its id counts. Only the fuzz rows
        # are read: a stack that holds for a year must not read a year of results (5.4 M results:
        # 5.8 s of gate, nearly all of it here, before)
        for prefix in FUZZ_PREFIXES:
            for r in store.results(run_id=run.run_id, test_prefix=prefix):
                if r.test_id not in latest and r.test_id not in carried and r.verdict != "infra":
                    carried[r.test_id] = r
    latest.update({t: r for t, r in carried.items() if r.verdict in BLOCKING})
    judged = [latest[t] for t in sorted(latest)]

    def age_of(run: RunRow) -> float | None:
        started = _parse_time(run.started_at)
        return (now - started).total_seconds() if started else None

    age = age_of(base or last)
    state = CellState(cell, "ok", last, age_of(last), last.stack.torch, last.torch_git or last.stack.torch_git,
                      evidence_runs=[r.run_id for r in since])
    last_rows = rows_of(last)
    if not last.ended_at:
        state.state, state.reason = "in_flight", "the latest run has not ended"
    elif not any(_ran(r) for r in last_rows):
        state.state = "infra_only"
        infra = [r for r in last_rows if r.verdict == "infra"]
        if infra:
            lines = infra[0].excerpt.strip().splitlines()
            state.reason = infra[0].error_signature or (lines[0] if lines else "the environment never came up")
        else:
            state.reason = f"no test ran ({len(last_rows)} skipped)" if last_rows else "the run recorded no result"
    elif age is None or age > max_age.total_seconds():
        state.state = "stale"
        what = "the latest complete run" if base is not None else "the latest run"
        state.reason = f"{what} is older than {format_duration(max_age)}" if age is not None else "no start time"
    elif base is None:
        state.state = "partial"
        state.reason = _cause(last, since, rows_of, current_env) or _narrowed(
            last, tier, tiers, {r.run_id for r in runs})
    else:
        expected = {r.test_id for m in members for r in rows_of(m) if not is_environment(r.test_id)} | set(latest)
        expected = {t for t in expected if not is_environment(t) and not is_fuzz(t)}
        state.missing_tests = sorted(t for t in expected if current_env not in on_stack.get(t, set()))
        if state.missing_tests:
            state.state = "partial"
            state.reason = _cause(last, since, rows_of, current_env) or (
                f"{len(state.missing_tests)} of {len(expected)} expected tests have no result on the current "
                f"stack (that of run {current_run}); rerun the cell")
    return state, judged


def _cause(last: RunRow, since: list[RunRow], rows_of, env: str | None) -> str:
    """Why a cell is partial when its latest run says so: it was stopped part-way, or it is
    a share of a split whose other shares have not run on this stack; "" otherwise (the
    caller names the cause that holds then). One cause, the one that holds."""
    if _interrupted(rows_of(last)):
        return (f"run {last.run_id} was stopped part-way: the tests after the one in flight never ran; "
                f"finish it with `distci run --cell {last.cell_id} --resume {last.run_id}`")
    shard = Selection.from_list(last.selection).share
    if shard is None:
        return ""
    n = shard[1]
    have = {got[0] for run in since if run.ended_at and env_key(run.stack) == env and not _interrupted(rows_of(run))
            and (got := Selection.from_list(run.selection).share) is not None and got[1] == n}
    missing = [k for k in range(1, n + 1) if k not in have]
    if not missing:
        return ""
    shares = ", ".join(f"{k}/{n}" for k in missing)
    return (f"share{'s' if len(missing) > 1 else ''} {shares} of the split that run {last.run_id} "
            f"({shard[0]}/{n}) belongs to {'have' if len(missing) > 1 else 'has'} not run on this stack")


def _narrowed(last: RunRow, tier: str, tiers: set[str], known: set[str]) -> str:
    """Why no run is complete when the latest was neither stopped nor a share: the one of
    narrowed, of a narrower tier, resuming runs the store lacks, or no expected test ran."""
    selection = Selection.from_list(last.selection)
    own = Selection(selection.keyword, selection.tests, selection.shard).to_list()
    lacking = [i for i in selection.resumes if i not in known]
    how = (f"is of tier {last.tier!r}" if last.tier not in tiers
           else f"was narrowed ({' '.join(own)})" if own
           else f"resumes runs the store does not hold ({', '.join(lacking)})" if lacking
           else "ran only fuzz configurations")
    return (f"no complete run of tier {tier!r} or a wider one: the latest, run {last.run_id}, {how}; "
            "the expected tests are unknown")


def _ran(r: ResultRow) -> bool:
    return r.verdict not in ("infra", "skip")


def _interrupted(rows: list[ResultRow]) -> bool:
    """A run stopped part-way (SIGINT, a runner taken back): the tests after the one in
    flight never started and have no row, so its rows are not its selection."""
    return any(r.verdict == "infra" and is_interruption(r.error_signature) for r in rows)


def _is_complete(run: RunRow, own: Selection, tiers: set[str], rows: list[ResultRow], *, shard: bool = False) -> bool:
    """A run that may define a cell's expected tests: ended, not stopped part-way, not
    narrowed (`shard`: narrowed by its shard alone) by its `own` selection (what it runs
    beyond the runs it resumes), of a covering tier (or of none: a run without a tier runs
    every test), and some test ran in it (a fuzz configuration does not count: a fuzz run
    defines no expected tests)."""
    narrowed_ok = own.share is not None if shard else not own.narrowed
    return bool(run.ended_at) and narrowed_ok and run.tier in tiers and not _interrupted(rows) and any(
        _ran(r) and not is_fuzz(r.test_id) for r in rows)


def _latest_base(runs: list[RunRow], tiers: set[str], rows_of) -> tuple[RunRow | None, list[RunRow]]:
    """(the run the walk starts at, the runs whose tests are expected): the latest complete
    run, or the latest set of shard runs that covers shares 1..N (the latest ended run of
    each share; the walk starts at the oldest of them), whichever completes nearer the end.
    A run that resumes others (`distci run --resume`) completes with them: together they
    ran its selection, so they count as one run (one share) whose tests are all expected;
    a run stopped part-way counts only through the run that resumes it."""
    by_id = {run.run_id: run for run in runs}
    shards: dict[int, dict[int, set[str]]] = {}
    for run in reversed(runs):
        own = Selection.from_list(run.selection)
        resumed = own.resumes
        if any(i not in by_id for i in resumed):
            continue  # a resumed run the store does not hold: what it answered is unknown
        shard = own.share
        if shard is None:
            if _is_complete(run, own, tiers, rows_of(run)):
                members = [r for r in runs if r.run_id == run.run_id or r.run_id in resumed]
                return members[0], members
            continue
        if not _is_complete(run, own, tiers, rows_of(run), shard=True):
            continue
        k, n = shard
        got = shards.setdefault(n, {})
        got.setdefault(k, {run.run_id, *resumed})
        if len(got) == n:
            members = [r for r in runs if any(r.run_id in share for share in got.values())]
            return members[0], members
    return None, []


def tally(results: Sequence[ResultRow]) -> dict[str, int]:
    """One run's results counted by what they mean, as the gate counts them: a known issue
    (`xfail`) is `known`, never `failed`; a flaky failure is `flaky`; infra is `infra`."""
    out = {"total": len(results), "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "known": 0, "flaky": 0,
           "infra": 0}
    for r in results:
        if r.verdict == "xfail":
            out["known"] += 1
        elif r.verdict == "flaky" and r.outcome in ("failed", "error"):
            out["flaky"] += 1
        elif r.verdict == "infra":
            out["infra"] += 1
        elif r.outcome == "failed":
            out["failed"] += 1
        elif r.outcome == "error":
            out["errors"] += 1
        elif r.outcome == "skipped":
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


def _parse_time(ts: str) -> datetime | None:
    try:
        dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "": 3600}


def parse_duration(text: str) -> timedelta:
    """`36h`, `90m`, `2d`, `3600s`; a bare number is hours."""
    m = _DURATION_RE.match(text)
    if not m:
        raise SelectionError(f"--max-age {text!r} is not a duration like 36h, 90m or 2d")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def format_duration(d: timedelta) -> str:
    s = d.total_seconds()
    return f"{s / 3600:g}h" if s % 3600 == 0 else f"{s / 60:g}m" if s % 60 == 0 else f"{s:g}s"
