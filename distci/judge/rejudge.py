"""Verdicts in the store: judged again where an ingest changed history, and nowhere else.

A verdict (distci.judge.verdicts) depends only on the same test's earlier outcomes in its
cell (the last informative one, the last FLAKY_WINDOW that were neither skipped nor
infra) and on the test's latest informative outcome in the baseline cell up to the run's
start. So a run R that lands in cell C changes the verdicts of exactly:

- the (run, test) results of C's runs from R's place in history on, for the tests R holds;
- the same tests' results in the cells that take C as their baseline, from R's start on.

`rejudge_tail` judges only those: it reads the runs from R on and starts `judge_history`
from the cell's CellMemory just before R: the one this connection kept after the cell's
newest run (Memo) when R lands right after it, else, for each test R holds, the rows that
make it, read from the cell's runs newest first until the window is full and an
informative outcome seen. A run being indexed is judged from its observations before its
results are written (Landing), so its verdicts go into their INSERT: one write per result,
not an INSERT and an UPDATE of the same rows and their verdict indexes. The answers are a
full recompute's (`rejudge_cells`, kept for `ingest --rebuild`): tests/test_rejudge.py
compares them over ingests in many orders and batchings and with a second writer. Tonight's ingest costs tonight's results, not the history's.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable

from distci.judge import verdicts as _verdicts
from distci.stack import Stack

_Key = tuple[str, str]  # (started_at, run_id): history order
_Current = dict[tuple[str, str], tuple[str, "str | None", str]]


class _Envs:
    """env_key of each run's stack, read once per recompute."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn, self.known = conn, {}

    def __call__(self, run_id: str) -> str:
        if run_id not in self.known:
            row = self.conn.execute("SELECT stack_json FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            self.known[run_id] = _verdicts.env_key(Stack.from_dict(json.loads(row[0]))) if row else ""
        return self.known[run_id]


@lru_cache(maxsize=256)
def _reruns(text: str) -> tuple[str, ...]:
    return tuple(json.loads(text))  # a handful of distinct values ('[]', '["passed"]', ...)


def observation(test_id: str, outcome: str, failure_kind: str | None, reruns: str,
                known_issue: str | None) -> _verdicts.Observation:
    """What verdicts see of a results row (its columns as the store holds them)."""
    return _verdicts.Observation(test_id, outcome, failure_kind, _reruns(reruns), known_issue)


@dataclass
class Landing:
    """A run being indexed: its runs row is in the store, its results rows are not yet.
    rejudge_tail judges it from `results` (test id -> the observation of the row it will
    write) and calls `insert` with its verdicts (test id -> Verdict; empty when it cannot
    judge them before they are written), before judging the cells that read it."""

    run_id: str
    results: dict[str, _verdicts.Observation]
    insert: Callable[[dict[str, _verdicts.Verdict]], None]


def _judge_and_write(conn: sqlite3.Connection, runs: list[_verdicts.RunHistory],
                     base: list[_verdicts.RunHistory], current: _Current, judged: set[str] | None = None,
                     state: _verdicts.CellMemory | None = None) -> tuple[int, dict[tuple[str, str], _verdicts.Verdict]]:
    """Judges `runs` (only those in `judged`, when given) against `base`, from `state`, and
    writes the verdicts of the (run, test) keys in `current` that changed; returns how many,
    and every verdict judged."""
    new = _verdicts.judge_history(runs, base, judged, state)
    changed = [
        (v.verdict, v.compared_run, v.reason, run_id, test_id)
        for (run_id, test_id), v in new.items()
        if (run_id, test_id) in current and current[(run_id, test_id)] != (v.verdict, v.compared_run, v.reason)
    ]
    conn.executemany(
        "UPDATE results SET verdict = ?, compared_run = ?, verdict_reason = ? WHERE run_id = ? AND test_id = ?", changed
    )
    return len(changed), new


# ------------------------------------------------------------ a full recompute


def _cell_history(conn: sqlite3.Connection, cell: str) -> tuple[list[_verdicts.RunHistory], _Current]:
    runs: dict[str, _verdicts.RunHistory] = {}
    for r in conn.execute("SELECT run_id, started_at, stack_json FROM runs WHERE cell_id = ?", (cell,)):
        runs[r[0]] = _verdicts.RunHistory(r[0], r[1], _verdicts.env_key(Stack.from_dict(json.loads(r[2]))))
    current: _Current = {}
    for r in conn.execute(
        """SELECT run_id, test_id, outcome, failure_kind, rerun_outcomes, known_issue, verdict,
                  compared_run, verdict_reason FROM results
           WHERE run_id IN (SELECT run_id FROM runs WHERE cell_id = ?)""",  # by run: no (cell, test) index
        (cell,),
    ):
        runs[r[0]].results[r[1]] = observation(r[1], r[2], r[3], r[4], r[5])
        current[(r[0], r[1])] = (r[6], r[7], r[8])
    return list(runs.values()), current


def _distinct(column: str, key: str) -> str:
    """The distinct non-null values of `column` among the runs whose `key` is ?, one index
    seek per value (runs_by_baseline / runs_by_dependent), not one step per run: every run
    landing asks, and a cell has a run a night for years."""
    return f"""WITH RECURSIVE v(x) AS (
        SELECT MIN({column}) FROM runs WHERE {key} = ?1 AND {column} IS NOT NULL
        UNION ALL SELECT (SELECT MIN({column}) FROM runs WHERE {key} = ?1 AND {column} > v.x) FROM v WHERE v.x IS NOT NULL)
      SELECT x FROM v WHERE x IS NOT NULL"""


_BASELINES = _distinct("baseline_cell", "cell_id")
_DEPENDENTS = _distinct("cell_id", "baseline_cell")


def baselines_of(conn: sqlite3.Connection, cell: str) -> list[str]:
    """The baseline cells the runs of `cell` declare."""
    return [r[0] for r in conn.execute(_BASELINES, (cell,))]


def dependents_of(conn: sqlite3.Connection, cell: str) -> list[str]:
    """The cells whose runs take `cell` as their baseline."""
    return [r[0] for r in conn.execute(_DEPENDENTS, (cell,))]


def rejudge_cells(conn: sqlite3.Connection, cells: Iterable[str]) -> int:
    """Every verdict of `cells` and of the cells that take them as baseline, from their
    whole history (the reference the incremental path is tested against)."""
    todo = set(cells)
    for cell in list(todo):
        todo.update(dependents_of(conn, cell))
    written = 0
    for cell in sorted(todo):
        runs, current = _cell_history(conn, cell)
        base: list[_verdicts.RunHistory] = []
        for b in baselines_of(conn, cell):
            base += _cell_history(conn, b)[0]
        written += _judge_and_write(conn, runs, base, current)[0]
    return written


# ---------------------------------------------------------- only what changed


_PROBE_ROWS = 8
"""A run is read whole while the tests still wanted times this reaches its result count,
else probed for each of them by the results primary key (run_id, test_id): one probe
costs about what reading this many rows of a run does. A cell's last runs hold nearly
every test's state, so a few reads by run serve hundreds of tests, and the few left walk
back alone."""
_RUNS_BEFORE = """SELECT run_id, started_at, n_results FROM runs WHERE cell_id = ? AND (started_at, run_id) < (?, ?)
    ORDER BY started_at DESC, run_id DESC LIMIT ?"""
_RUNS_UP_TO = """SELECT run_id, started_at, n_results FROM runs WHERE cell_id = ? AND started_at <= ?
    ORDER BY started_at DESC, run_id DESC LIMIT ?"""
_ONE = """SELECT outcome, failure_kind, rerun_outcomes, known_issue FROM results WHERE run_id = ? AND test_id = ?"""


class _State:
    """The rows, newest first, that make one test's state at a point of history: outcomes
    neither skipped nor infra until `window` of them are held and one was informative."""

    def __init__(self, window: int) -> None:
        self.window, self.rows, self.informative = window, [], False

    @property
    def whole(self) -> bool:
        return len(self.rows) >= self.window and self.informative

    def take(self, row: tuple) -> None:
        obs = observation("", *row[2:6])
        if obs.outcome == "skipped" or obs.is_infra:
            return
        self.rows.append(row)
        self.informative = self.informative or obs.informative


def _states(conn: sqlite3.Connection, cell: str, point: _Key, tests: Iterable[str], *, window: int,
            up_to: bool) -> dict[str, list[tuple]]:
    """Each test's state rows (newest first) in `cell` just before `point` (with `up_to`, at
    `point`'s time: runs started then count, as a baseline's do): the cell's runs walked
    newest first (runs_by_cell) until every test's state is whole, each run read whole while
    many tests are wanted, else probed for the few still wanted. No index clustered by
    (cell, test) is kept for this: every run would dirty a page of it per test (docs/benchmarks.md
    "Benchmarks": four fifths of what a year-sized ingest wrote)."""
    states = {t: _State(window) for t in tests}
    if not states:
        return {}
    sql, args = (_RUNS_UP_TO, (cell, point[0])) if up_to else (_RUNS_BEFORE, (cell, *point))
    for run_id, started_at, n_results in conn.execute(sql, (*args, -1)):  # read as walked: most are whole soon
        wanted = [t for t, st in states.items() if not st.whole]
        if not wanted:
            break
        if len(wanted) * _PROBE_ROWS >= n_results:
            keep = set(wanted)
            for r in conn.execute("SELECT test_id, outcome, failure_kind, rerun_outcomes, known_issue FROM results "
                                  "WHERE run_id = ?", (run_id,)):
                if r[0] in keep:
                    states[r[0]].take((run_id, started_at, *r[1:]))
            continue
        for test_id in wanted:
            r = conn.execute(_ONE, (run_id, test_id)).fetchone()
            if r is not None:
                states[test_id].take((run_id, started_at, *r))
    return {t: st.rows for t, st in states.items()}


class Memo:
    """Each cell's test states after its newest run, as this connection last judged them:
    a backfill landing night after night then reads no history at all. Only this
    connection's own ingests keep it; any other connection's commit (PRAGMA data_version)
    throws it away, and a run landing anywhere but after a cell's newest drops that cell's."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.cells: dict[str, tuple[_Key, _verdicts.CellMemory, set[str]]] = {}
        """cell -> (its newest run, its state after it, the tests that state knows: a test
        known with no history kept, e.g. always skipped, is not read again)."""
        self.envs: dict[str, str] = {}

    def check(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self.version:
            self.cells.clear()
            self.envs.clear()
            self.version = version

    def take(self, conn: sqlite3.Connection, cell: str, first: _Key) -> tuple[_verdicts.CellMemory, set[str]]:
        """The state known for `cell` just before `first` and the tests it knows, if `first`
        lands right after the cell's newest run (else an empty one); taken out: it is judged
        forward in place, and put back only when the judging is whole."""
        known = self.cells.pop(cell, None)
        if known is not None and known[0] < first:
            newest = conn.execute(_RUNS_BEFORE, (cell, *first, 1)).fetchone()
            if newest is not None and (newest[1], newest[0]) == known[0]:
                return known[1], known[2]
        return _verdicts.CellMemory(), set()


def _add(runs: dict[str, _verdicts.RunHistory], envs: _Envs, test_id: str, row: tuple) -> None:
    run_id, started_at = row[0], row[1]
    if run_id not in runs:
        runs[run_id] = _verdicts.RunHistory(run_id, started_at, envs(run_id))
    runs[run_id].results[test_id] = observation(test_id, *row[2:6])


def _runs_from(conn: sqlite3.Connection, cell: str, since: _Key, envs: _Envs, tests: set[str] | None,
               *, inclusive_ties: bool) -> tuple[dict[str, _verdicts.RunHistory], _Current, bool]:
    """The runs of `cell` from `since` on in history order (with `inclusive_ties` false,
    those started strictly after since's time), holding their results for `tests` (None:
    all), the verdicts those results have now, and whether they hold every result."""
    if inclusive_ties:
        sql, args = ("SELECT run_id, started_at, stack_json FROM runs WHERE cell_id = ? AND (started_at, run_id) >= (?, ?)",
                     (cell, *since))
    else:
        sql, args = "SELECT run_id, started_at, stack_json FROM runs WHERE cell_id = ? AND started_at > ?", (cell, since[0])
    runs = {}
    for run_id, started_at, stack_json in conn.execute(sql, args):
        envs.known[run_id] = _verdicts.env_key(Stack.from_dict(json.loads(stack_json)))  # fresh: a re-indexed run's stack may differ
        runs[run_id] = _verdicts.RunHistory(run_id, started_at, envs.known[run_id])
    current: _Current = {}
    whole = True
    for run_id, run in runs.items():
        for r in conn.execute(
            """SELECT test_id, outcome, failure_kind, rerun_outcomes, known_issue, verdict, compared_run,
                      verdict_reason FROM results WHERE run_id = ?""", (run_id,)
        ):
            if tests is None or r[0] in tests:
                run.results[r[0]] = observation(r[0], r[1], r[2], r[3], r[4])
                current[(run_id, r[0])] = (r[5], r[6], r[7])
            else:
                whole = False
    return runs, current, whole


def rejudge_tail(conn: sqlite3.Connection, cell: str, since: _Key, tests: set[str] | None = None,
                 *, memo: Memo | None = None, landing: Landing | None = None, _dependents: bool = True) -> int:
    """Judges again the results of `cell`'s runs from `since` (a run's (started_at,
    run_id)) on, for `tests` (None: every test those runs hold), and the same tests in the
    cells that take `cell` as their baseline from since's start on; the same verdicts a
    full recompute writes. `memo` carries states from one call to the next on one
    connection. `landing`, a run of `cell` from `since` on whose results are not written
    yet, is judged with the others and written through its `insert`. Returns how many
    verdicts changed (a landing run's count as changed)."""
    memo = memo if memo is not None else Memo()
    memo.check(conn)
    if landing is not None and cell in baselines_of(conn, cell):  # it reads itself as a baseline: write it first
        landing.insert({})
        landing = None
    envs = _Envs(conn)
    envs.known = memo.envs
    tail, current, whole = _runs_from(conn, cell, since, envs, tests, inclusive_ties=True)
    if landing is not None:
        if landing.run_id not in tail:
            raise ValueError(f"run {landing.run_id} is not in cell {cell} from {since} on")
        held = tail[landing.run_id].results
        for test_id, obs in landing.results.items():
            if tests is None or test_id in tests:
                held[test_id] = obs
            else:
                whole = False
    written = 0
    if tail:
        held = {t for run in tail.values() for t in run.results}
        first = min((r.started_at, r.run_id) for r in tail.values())
        window = _verdicts.FLAKY_WINDOW
        state, known = memo.take(conn, cell, first)
        unknown = held - known
        prior: dict[str, _verdicts.RunHistory] = {}
        for test_id, kept in _states(conn, cell, first, unknown, window=window, up_to=False).items():
            for row in kept:
                _add(prior, envs, test_id, row)
        for run in sorted(prior.values(), key=lambda r: (r.started_at, r.run_id)):
            for test_id, obs in run.results.items():
                state.take(run, test_id, obs)
        base: dict[str, _verdicts.RunHistory] = {}
        for b in baselines_of(conn, cell):  # judge_history keeps only the latest informative baseline outcome
            for test_id, kept in _states(conn, b, first, held, window=1, up_to=True).items():
                for row in kept:
                    _add(base, envs, test_id, row)
            later, _, _ = _runs_from(conn, b, first, envs, held, inclusive_ties=False)
            for run_id, run in later.items():
                base.setdefault(run_id, run).results.update(run.results)
        changed, new = _judge_and_write(conn, list(tail.values()), list(base.values()), current, None, state)
        written += changed
        if landing is not None:
            mine = {test_id: v for (run_id, test_id), v in new.items() if run_id == landing.run_id}
            landing.insert(mine)
            written += len(mine)
        if len(tail) == 1 and whole:
            memo.cells[cell] = (first, state, known | held)
    if _dependents:
        scope = tests if tests is not None else ({t for run in tail.values() for t in run.results} or None)
        for other in dependents_of(conn, cell):
            if other != cell:
                written += rejudge_tail(conn, other, (since[0], ""), scope, memo=memo, _dependents=False)
    return written

