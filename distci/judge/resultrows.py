"""The results rows ingest writes: one per Result, its text kept whole, written once.

A year of history is millions of rows, so the per-row work is what an ingest costs:

- text is checked for what SQLite cannot hold (`storable`) only where it can hold such a
  character at all: a run whose results.jsonl bytes are ASCII with no `\\u` escape has only
  ASCII text (JSON writes other characters as themselves or as `\\uXXXX`), so its rows need
  no check (`plain_text`);
- a row is written with its verdict (distci.judge.rejudge.Landing judges the run from the
  observations its rows will hold), not inserted and then updated.
"""

from __future__ import annotations

import json
import re
import sqlite3

from distci.judge.rejudge import Landing, observation
from distci.judge.rows import suite_of
from distci.judge.verdicts import Verdict
from distci.results import Result, error_signature
from distci.rundir import utc

EXCERPT_CHARS = 4000
RANK_EXCERPT_CHARS = 1500
INSERT = """INSERT OR REPLACE INTO results (run_id, test_id, cell_id, suite, outcome, duration_s,
    failure_kind, error_signature, excerpt, repro, known_issue, reruns, rerun_outcomes, started_at,
    run_started_at, verdict, compared_run, verdict_reason) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"""
_UNJUDGED = ("", None, "")


def storable(text: str | None) -> str | None:
    """Text SQLite can hold, losing nothing: characters UTF-8 cannot encode (the lone
    surrogates a rank's raw non-UTF-8 bytes decode to) become backslash escapes
    (`\\udc80`), so one odd byte in a message never costs the run its place in the store."""
    if text is None or text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def plain_text(raw: bytes) -> bool:
    """Whether every string the Results of these results.jsonl bytes hold is ASCII."""
    return raw.isascii() and b"\\u" not in raw


def result_row(r: Result, run_started_at: str, known_issue: str | None, *, plain: bool = False) -> tuple:
    """A results row without its verdict columns. `plain`: the Result's text is known to be
    ASCII (plain_text of its line; run_started_at and known_issue are checked here)."""
    row = (r.run_id, r.test_id, r.cell_id, suite_of(r.test_id), r.outcome, r.duration_s, r.failure_kind,
           _signature(r), _excerpt(r), r.repro, known_issue, r.reruns,
           json.dumps(r.rerun_outcomes) if r.rerun_outcomes else "[]", _utc(r.started_at), run_started_at)
    if plain and run_started_at.isascii() and (known_issue is None or known_issue.isascii()):
        return row
    if "".join(v for v in row if type(v) is str).isascii():
        return row
    return tuple(storable(v) if isinstance(v, str) else v for v in row)


def insert_results(conn: sqlite3.Connection, rows: list[tuple], verdicts: dict[str, Verdict]) -> None:
    """Writes a run's rows (result_row) with their verdicts (test id -> Verdict; a test
    without one is left unjudged, as a deferred rebuild wants)."""
    conn.executemany(INSERT, [
        row + ((v.verdict, v.compared_run, v.reason) if (v := verdicts.get(row[1])) is not None else _UNJUDGED)
        for row in rows
    ])


def landing(conn: sqlite3.Connection, run_id: str, rows: list[tuple]) -> Landing:
    """The run as rejudge judges it before its rows exist: each row's observation, from the
    columns it will hold (a full recompute reads the same values back)."""
    observations = {row[1]: observation(row[1], row[4], row[6], row[12], row[10]) for row in rows}
    return Landing(run_id, observations, lambda verdicts: insert_results(conn, rows, verdicts))


def _utc(ts: str) -> str:
    """utc(ts), without parsing what is already in its form (`YYYY-MM-DDTHH:MM:SS+00:00`)."""
    if len(ts) == 25 and ts[10] == "T" and ts.endswith("+00:00") and ts[:4].isdigit():
        return ts
    return utc(ts)


def _excerpt(r: Result) -> str:
    text = r.message.strip()[:EXCERPT_CHARS]
    for rank in r.ranks:
        if rank.outcome != "passed" and rank.excerpt.strip():
            text += f"\n--- rank {rank.rank} ({rank.outcome}) ---\n" + rank.excerpt.strip()[-RANK_EXCERPT_CHARS:]
    return text


_EXC_RE = re.compile(r"\s*([A-Za-z_][\w.]*(?:Error|Exception|Failure|Interrupt|Exit))\s*:\s*(.*)", re.DOTALL)


def _signature(r: Result) -> str | None:
    """The harness's signature, else one made the same way from the message."""
    if r.error_signature:
        return r.error_signature
    if r.outcome not in ("failed", "error") or not r.message.strip():
        return None
    m = _EXC_RE.match(r.message)
    return error_signature(m.group(1), m.group(2)) if m else error_signature(r.failure_kind or r.outcome, r.message)
