"""The store: a SQLite index over the per-run JSONL files, rebuildable at any time.

The JSONL files under `.distci/runs/<run-id>/` are the source of truth (distci.results):
appended while a run goes, never rewritten. This module indexes them so the gate, the
dashboard and the export can ask questions across runs, cells and nights without
re-reading every file. Deleting the SQLite file loses nothing: `rebuild` re-indexes the
same files and gives the same answers.

Ingest is idempotent and safe to run from many processes at once (artifacts of many
runners arrive together): the database is in WAL mode, each ingest holds one
`BEGIN IMMEDIATE` write transaction and waits for others through busy_timeout.

A run already indexed with the same content is skipped. A run whose results.jsonl grew
(it was ingested while it was still being appended to) is re-indexed: the old content is
a prefix of the new one, which is what append-only allows. A run whose indexed content is
NOT a prefix of the new file was rewritten, which the format forbids; that run is
reported by id and path (StoreError) and left as it was, while the other runs of the
same ingest are still indexed.

Verdicts (distci.verdicts) are computed here at ingest, in history order, for every cell
the ingest touched (and the cells that use it as their baseline).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sqlite3
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from distci import verdicts as _verdicts
from distci.errors import StoreError
from distci.results import RESULTS_FILE, STACK_FILE, Result, error_signature, read_results

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
DEFAULT_STORE = Path(".distci") / "store.sqlite"
DEFAULT_RUNS_ROOT = Path(".distci") / "runs"
DEFAULT_AUDIT_DIR = Path(".distci") / "audit"
DEFAULT_BISECT_DIR = Path(".distci") / "bisect"
STORE_ENV = "DISTCI_STORE"
BUSY_TIMEOUT_MS = 120_000
EXCERPT_CHARS = 4000
RANK_EXCERPT_CHARS = 1500




def default_store_path() -> Path:
    """DISTCI_STORE if set, else .distci/store.sqlite under the current directory."""
    return Path(os.environ.get(STORE_ENV) or DEFAULT_STORE)


def is_environment(test_id: str) -> bool:
    """Whether a result stands for the environment, not a test (`<infra>::<cell id>`:
    the record a run leaves when its environment never came up)."""
    return test_id.startswith("<")


def suite_of(test_id: str) -> str:
    """The suite a test belongs to, from its pytest node id: the dashboard's grid columns.

    `suites/regressions/test_x.py::t` -> `regressions` (a directory of suites/ is a
    suite); `suites/test_tp.py::t` -> `tp` (so is a top-level file, without `test_`);
    `<infra>::cell` -> `<infra>`.
    """
    path = test_id.split("::", 1)[0]
    if is_environment(test_id):
        return path
    parts = [p for p in path.split("/") if p and p != "."]
    if parts and parts[0] == "suites":
        parts = parts[1:]
    if len(parts) > 1:
        return parts[0]
    stem = parts[0].rsplit(".", 1)[0] if parts else test_id
    return stem[5:] if stem.startswith("test_") else stem


_NIGHTLY_RE = re.compile(r"\.dev(\d{4})(\d{2})(\d{2})")


def nightly_date_of(version: str | None) -> str | None:
    """The nightly date of a torch version like `2.10.0.dev20250901+cu130`, else None."""
    m = _NIGHTLY_RE.search(version or "")
    return f"{m.group(1)}-{m.group(2)}-{m.group(3)}" if m else None


def _utc(ts: str | None) -> str:
    """An ISO timestamp normalized to UTC so runs from many runners sort by string."""
    if not ts:
        return ""
    try:
        dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return ts
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunInfo:
    """run.json: what the runner knows about a run that its results do not say.

    `baseline_cell` is the cell this one is compared with when it has no history of
    its own (declared in matrix.toml; the runner copies it here so verdicts can be
    recomputed from the files alone).
    """

    run_id: str
    cell_id: str
    started_at: str = ""
    ended_at: str = ""
    runner: str = ""
    backend: str = ""
    image_digest: str | None = None
    tier: str = ""
    nightly_date: str | None = None
    baseline_cell: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunInfo":
        """Tolerates unknown keys (run.json grows) and nulls where text is expected."""
        out = cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        for f in fields(cls):
            if f.default == "" and getattr(out, f.name) is None:
                setattr(out, f.name, "")
        return out

    @classmethod
    def derive(cls, run_dir: Path, results: Sequence[Result], stack: dict[str, Any]) -> "RunInfo":
        """A RunInfo for a run without run.json, from its results and stack."""
        first = results[0] if results else None
        starts = sorted(_utc(r.started_at) for r in results if r.started_at)
        ends = []
        for r in results:
            try:
                t = datetime.fromisoformat(_utc(r.started_at)).timestamp() + r.duration_s
                ends.append(datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds"))
            except ValueError:
                continue
        return cls(
            run_id=first.run_id if first else run_dir.name,
            cell_id=first.cell_id if first else "",
            started_at=starts[0] if starts else "",
            ended_at=max(ends) if ends else "",
            image_digest=stack.get("image_digest"),
            nightly_date=nightly_date_of(stack.get("torch")),
        )


@dataclass
class RunRow(RunInfo):
    """A run as the store holds it."""

    stack: dict[str, Any] = field(default_factory=dict)
    torch_git: str | None = None
    source_path: str = ""
    content_hash: str = ""
    n_results: int = 0

    @property
    def night(self) -> str:
        """The nightly date, or the day the run started: the column a history sits in."""
        return self.nightly_date or self.started_at[:10]


@dataclass
class ResultRow:
    """A result as the store holds it: the outcome, its verdict and why."""

    run_id: str
    test_id: str
    cell_id: str
    suite: str
    outcome: str
    verdict: str
    compared_run: str | None
    verdict_reason: str
    duration_s: float
    failure_kind: str | None
    error_signature: str | None
    excerpt: str
    repro: str
    known_issue: str | None
    reruns: int
    rerun_outcomes: list[str]
    started_at: str


@dataclass
class BisectRow:
    """One bisect result: the first bad point of `axis` between good and bad."""

    test_id: str
    axis: str
    good: str
    bad: str
    culprit: str | None = None
    report_path: str = ""
    cell_id: str = ""
    status: str = ""
    created_at: str = ""


@dataclass
class FixAuditRow:
    """One fix on one version: is the bug there, did the fix apply, what its test says.

    `off`/`on` are the regression test's outcome with the fix disabled/enabled;
    `verdict` is the audit's conclusion (e.g. needed, obsolete, broken, ineffective).
    """

    fix: str
    version: str
    present: str | None = None
    applied: str | None = None
    off: str | None = None
    on: str | None = None
    verdict: str | None = None
    cell_id: str = ""
    source_path: str = ""


@dataclass
class IngestReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    results: int = 0

    def summary(self) -> str:
        text = (
            f"{len(self.added)} runs added, {len(self.updated)} re-indexed, "
            f"{len(self.skipped)} unchanged, {self.results} results indexed"
        )
        return text + (f", {len(self.conflicts)} rejected" if self.conflicts else "")


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY,
        cell_id TEXT NOT NULL,
        started_at TEXT NOT NULL DEFAULT '',
        ended_at TEXT NOT NULL DEFAULT '',
        runner TEXT NOT NULL DEFAULT '',
        backend TEXT NOT NULL DEFAULT '',
        image_digest TEXT,
        tier TEXT NOT NULL DEFAULT '',
        nightly_date TEXT,
        baseline_cell TEXT,
        torch_git TEXT,
        stack_json TEXT NOT NULL DEFAULT '{}',
        source_path TEXT NOT NULL DEFAULT '',
        content_hash TEXT NOT NULL,
        content_size INTEGER NOT NULL,
        meta_hash TEXT NOT NULL,
        n_results INTEGER NOT NULL DEFAULT 0,
        ingested_at TEXT NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX IF NOT EXISTS runs_by_cell ON runs(cell_id, started_at)",
    """CREATE TABLE IF NOT EXISTS results (
        run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
        test_id TEXT NOT NULL,
        cell_id TEXT NOT NULL,
        suite TEXT NOT NULL,
        outcome TEXT NOT NULL,
        verdict TEXT NOT NULL DEFAULT '',
        compared_run TEXT,
        verdict_reason TEXT NOT NULL DEFAULT '',
        duration_s REAL NOT NULL DEFAULT 0,
        failure_kind TEXT,
        error_signature TEXT,
        excerpt TEXT NOT NULL DEFAULT '',
        repro TEXT NOT NULL DEFAULT '',
        known_issue TEXT,
        reruns INTEGER NOT NULL DEFAULT 0,
        rerun_outcomes TEXT NOT NULL DEFAULT '[]',
        started_at TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (run_id, test_id)
    )""",
    "CREATE INDEX IF NOT EXISTS results_by_cell ON results(cell_id, test_id)",
    "CREATE INDEX IF NOT EXISTS results_by_verdict ON results(verdict)",
    """CREATE TABLE IF NOT EXISTS bisects (
        test_id TEXT NOT NULL,
        axis TEXT NOT NULL,
        good TEXT NOT NULL,
        bad TEXT NOT NULL,
        culprit TEXT,
        report_path TEXT NOT NULL DEFAULT '',
        cell_id TEXT NOT NULL DEFAULT '',
        status TEXT NOT NULL DEFAULT '',
        created_at TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (test_id, axis, good, bad)
    )""",
    """CREATE TABLE IF NOT EXISTS fix_audit (
        fix TEXT NOT NULL,
        version TEXT NOT NULL,
        present TEXT,
        applied TEXT,
        "off" TEXT,
        "on" TEXT,
        verdict TEXT,
        cell_id TEXT NOT NULL DEFAULT '',
        source_path TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (fix, version, cell_id)
    )""",
)


@dataclass
class _RunArtifact:
    """A run directory read from disk, before it touches the database."""

    path: Path
    info: RunInfo
    stack: dict[str, Any]
    results: list[Result]
    content_hash: str
    content_size: int
    meta_hash: str
    raw: bytes


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise StoreError(f"not valid JSON ({exc})", where=str(path)) from exc


def read_run(run_dir: Path) -> _RunArtifact:
    """Reads one run directory: results.jsonl (through read_results), run.json, stack.json."""
    run_dir = Path(run_dir)
    jsonl = run_dir / RESULTS_FILE
    for _ in range(5):
        raw = jsonl.read_bytes() if jsonl.exists() else b""
        try:
            results = list(read_results(jsonl)) if jsonl.exists() else []
        except (TypeError, ValueError) as exc:
            raise StoreError(f"not a results file: {exc}", where=str(jsonl)) from exc
        after = jsonl.read_bytes() if jsonl.exists() else b""
        if after == raw:
            break
        time.sleep(0.05)  # the run is still appending; read a consistent snapshot
    else:
        raise StoreError("results.jsonl keeps changing while it is read", where=str(jsonl))
    meta_raw = b""
    stack: dict[str, Any] = {}
    if (run_dir / STACK_FILE).exists():
        meta_raw += (run_dir / STACK_FILE).read_bytes()
        stack = _read_json(run_dir / STACK_FILE)
    elif results:
        stack = dict(results[0].stack)
    info = RunInfo.derive(run_dir, results, stack)
    if (run_dir / RUN_FILE).exists():
        meta_raw += b"\0" + (run_dir / RUN_FILE).read_bytes()
        data = _read_json(run_dir / RUN_FILE)
        if not isinstance(data, dict):
            raise StoreError("run.json is not an object", where=str(run_dir / RUN_FILE))
        info = RunInfo.from_dict({"run_id": info.run_id, "cell_id": info.cell_id, **data})
    if not info.run_id or not info.cell_id:
        raise StoreError("run has no run id or cell id (no run.json and no results)", where=str(run_dir))
    for r in results:
        if r.run_id != info.run_id or r.cell_id != info.cell_id:
            raise StoreError(
                f"result {r.test_id} belongs to run {r.run_id} of cell {r.cell_id}, "
                f"not run {info.run_id} of cell {info.cell_id}",
                where=str(jsonl),
            )
    info.started_at = _utc(info.started_at) or min((_utc(r.started_at) for r in results if r.started_at), default="")
    info.ended_at = _utc(info.ended_at)
    if info.image_digest is None:
        info.image_digest = stack.get("image_digest")
    return _RunArtifact(
        path=run_dir,
        info=info,
        stack=stack,
        results=results,
        content_hash=_sha(raw),
        content_size=len(raw),
        meta_hash=_sha(meta_raw),
        raw=raw,
    )


def find_run_dirs(paths: Iterable[Path]) -> list[Path]:
    """Run directories under the given paths: a run directory itself, or any parent of many."""
    found: set[Path] = set()
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise StoreError("no such file or directory", where=str(p))
        if p.is_file():
            p = p.parent
        for root, dirs, files in os.walk(p):
            dirs.sort()
            if RESULTS_FILE in files or RUN_FILE in files:
                found.add(Path(root))
    return sorted(found)


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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """An open store. Use as a context manager; every method is one short transaction."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        try:
            self._setup()
        except BaseException as exc:
            self.conn.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreError(
                    f"not a usable store ({exc}); delete it and run `nox -s ingest -- --rebuild`", where=str(self.path)
                ) from exc
            raise

    def _setup(self) -> None:
        self.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._retry_locked(lambda: self.conn.execute("PRAGMA journal_mode = WAL"))
        self.conn.execute("PRAGMA foreign_keys = ON")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        with self._write():
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise StoreError(
                    f"store schema {version} is not {SCHEMA_VERSION}; delete it and run "
                    "`nox -s ingest -- --rebuild` (it is an index, the JSONL files are kept)",
                    where=str(self.path),
                )
            for stmt in _SCHEMA:
                self.conn.execute(stmt)
            self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    @staticmethod
    def _retry_locked(fn: Any, attempts: int = 200) -> Any:
        for i in range(attempts):
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or i == attempts - 1:
                    raise
                time.sleep(0.05)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front so two
        ingests never both read, then both fail to upgrade (busy_timeout makes it wait)."""
        self._retry_locked(lambda: self.conn.execute("BEGIN IMMEDIATE"))
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # ---------------------------------------------------------------- ingest

    def ingest(self, paths: Iterable[Path | str]) -> IngestReport:
        """Indexes every run directory under `paths`; idempotent.

        Raises StoreError after indexing everything else when some runs contradict what
        is already indexed (their JSONL was rewritten); `exc.report` has the report.
        """
        report = IngestReport()
        artifacts = [read_run(d) for d in find_run_dirs(Path(p) for p in paths)]
        problems: list[str] = []
        with self._write() as conn:
            touched: set[str] = set()
            for art in artifacts:
                state = self._ingest_run(conn, art)
                if state == "conflict":
                    row = conn.execute("SELECT source_path FROM runs WHERE run_id = ?", (art.info.run_id,)).fetchone()
                    problems.append(
                        f"run {art.info.run_id}: {art.path / RESULTS_FILE} is not an append-only "
                        f"continuation of the indexed {row['source_path']}/{RESULTS_FILE}"
                    )
                    report.conflicts.append(art.info.run_id)
                    continue
                getattr(report, state).append(art.info.run_id)
                if state != "skipped":
                    report.results += len(art.results)
                    touched.add(art.info.cell_id)
            self._recompute(conn, touched)
        if problems:
            err = StoreError("; ".join(problems) + " (JSONL files are never rewritten: give the run a new id)")
            err.report = report  # type: ignore[attr-defined]
            raise err
        return report

    def _ingest_run(self, conn: sqlite3.Connection, art: _RunArtifact) -> str:
        info = art.info
        old = conn.execute(
            "SELECT content_hash, content_size, meta_hash FROM runs WHERE run_id = ?", (info.run_id,)
        ).fetchone()
        if old is not None:
            if old["content_hash"] == art.content_hash and old["meta_hash"] == art.meta_hash:
                return "skipped"
            prefix = art.raw[: old["content_size"]]
            if len(art.raw) < old["content_size"] or _sha(prefix) != old["content_hash"]:
                return "conflict"
            conn.execute("DELETE FROM runs WHERE run_id = ?", (info.run_id,))
        conn.execute(
            """INSERT INTO runs (run_id, cell_id, started_at, ended_at, runner, backend, image_digest,
                tier, nightly_date, baseline_cell, torch_git, stack_json, source_path, content_hash,
                content_size, meta_hash, n_results, ingested_at)
               VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
            (
                info.run_id,
                info.cell_id,
                info.started_at,
                info.ended_at,
                info.runner,
                info.backend,
                info.image_digest,
                info.tier,
                info.nightly_date,
                info.baseline_cell,
                art.stack.get("torch_git"),
                json.dumps(art.stack, sort_keys=True, default=str),
                str(art.path),
                art.content_hash,
                art.content_size,
                art.meta_hash,
                len(art.results),
                _now(),
            ),
        )
        conn.executemany(
            """INSERT OR REPLACE INTO results (run_id, test_id, cell_id, suite, outcome, duration_s,
                failure_kind, error_signature, excerpt, repro, known_issue, reruns, rerun_outcomes,
                started_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
            [
                (
                    r.run_id,
                    r.test_id,
                    r.cell_id,
                    suite_of(r.test_id),
                    r.outcome,
                    r.duration_s,
                    r.failure_kind,
                    _signature(r),
                    _excerpt(r),
                    r.repro,
                    r.known_issue,
                    r.reruns,
                    json.dumps(r.rerun_outcomes),
                    _utc(r.started_at),
                )
                for r in art.results
            ],
        )
        return "added" if old is None else "updated"

    # -------------------------------------------------------------- verdicts

    def recompute_verdicts(self, cells: Iterable[str] | None = None) -> None:
        """Recomputes the verdicts of the given cells (all cells by default)."""
        with self._write() as conn:
            wanted = set(cells) if cells is not None else {r[0] for r in conn.execute("SELECT cell_id FROM runs")}
            self._recompute(conn, wanted)

    def _recompute(self, conn: sqlite3.Connection, cells: set[str]) -> None:
        if not cells:
            return
        todo = set(cells)
        for cell in cells:
            todo.update(
                r[0] for r in conn.execute("SELECT DISTINCT cell_id FROM runs WHERE baseline_cell = ?", (cell,))
            )
        for cell in sorted(todo):
            runs, current = self._histories(conn, cell)
            baselines = [
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT baseline_cell FROM runs WHERE cell_id = ? AND baseline_cell IS NOT NULL", (cell,)
                )
            ]
            base_runs: list[_verdicts.RunHistory] = []
            for b in baselines:
                base_runs += self._histories(conn, b)[0]
            new = _verdicts.judge_history(runs, base_runs)
            conn.executemany(
                "UPDATE results SET verdict = ?, compared_run = ?, verdict_reason = ? WHERE run_id = ? AND test_id = ?",
                [
                    (v.verdict, v.compared_run, v.reason, run_id, test_id)
                    for (run_id, test_id), v in new.items()
                    if current.get((run_id, test_id)) != (v.verdict, v.compared_run, v.reason)
                ],
            )

    @staticmethod
    def _histories(
        conn: sqlite3.Connection, cell: str
    ) -> tuple[list[_verdicts.RunHistory], dict[tuple[str, str], tuple[str, str | None, str]]]:
        runs: dict[str, _verdicts.RunHistory] = {}
        for r in conn.execute("SELECT run_id, started_at, stack_json FROM runs WHERE cell_id = ?", (cell,)):
            runs[r["run_id"]] = _verdicts.RunHistory(
                r["run_id"], r["started_at"], _verdicts.env_key(json.loads(r["stack_json"]))
            )
        current = {}
        for r in conn.execute(
            """SELECT run_id, test_id, outcome, failure_kind, rerun_outcomes, known_issue, verdict,
                      compared_run, verdict_reason FROM results WHERE cell_id = ?""",
            (cell,),
        ):
            runs[r["run_id"]].results[r["test_id"]] = _verdicts.Observation(
                r["test_id"], r["outcome"], r["failure_kind"], tuple(json.loads(r["rerun_outcomes"])), r["known_issue"]
            )
            current[(r["run_id"], r["test_id"])] = (r["verdict"], r["compared_run"], r["verdict_reason"])
        return list(runs.values()), current

    # ------------------------------------------------------- bisects, audits

    def add_bisects(self, rows: Iterable[BisectRow]) -> None:
        with self._write() as conn:
            conn.executemany(
                """INSERT OR REPLACE INTO bisects (test_id, axis, good, bad, culprit, report_path, cell_id,
                    status, created_at) VALUES (?,?,?,?,?,?,?,?,?)""",
                [
                    (b.test_id, b.axis, b.good, b.bad, b.culprit, b.report_path, b.cell_id, b.status, b.created_at)
                    for b in rows
                ],
            )

    def add_fix_audit(self, rows: Iterable[FixAuditRow]) -> None:
        with self._write() as conn:
            conn.executemany(
                """INSERT OR REPLACE INTO fix_audit (fix, version, present, applied, "off", "on", verdict,
                    cell_id, source_path) VALUES (?,?,?,?,?,?,?,?,?)""",
                [
                    (a.fix, a.version, a.present, a.applied, a.off, a.on, a.verdict, a.cell_id, a.source_path)
                    for a in rows
                ],
            )

    def import_fix_audit(self, audit_dir: Path) -> int:
        """Indexes every `*.json` fix audit file of a directory (see read_fix_audit)."""
        rows = [row for p in sorted(Path(audit_dir).glob("*.json")) for row in read_fix_audit(p)]
        self.add_fix_audit(rows)
        return len(rows)

    def import_bisects(self, bisect_dir: Path) -> int:
        """Indexes every bisect report (`*.json`, any depth) of a directory (see read_bisect)."""
        rows = [row for p in sorted(Path(bisect_dir).rglob("*.json")) for row in read_bisect(p)]
        self.add_bisects(rows)
        return len(rows)

    # --------------------------------------------------------------- queries

    def cells(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT DISTINCT cell_id FROM runs ORDER BY cell_id")]

    def runs(self, cell_id: str | None = None, tier: str | None = None) -> list[RunRow]:
        """Runs in history order, optionally of one cell or tier."""
        sql, args = "SELECT * FROM runs WHERE 1=1", []
        if cell_id is not None:
            sql, args = sql + " AND cell_id = ?", args + [cell_id]
        if tier is not None:
            sql, args = sql + " AND tier = ?", args + [tier]
        return [self._run_row(r) for r in self.conn.execute(sql + " ORDER BY started_at, run_id", args)]

    def run(self, run_id: str) -> RunRow | None:
        row = self.conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return self._run_row(row) if row else None

    def result(self, run_id: str, test_id: str) -> ResultRow | None:
        row = self.conn.execute("SELECT * FROM results WHERE run_id = ? AND test_id = ?", (run_id, test_id)).fetchone()
        return self._result_row(row) if row else None

    def latest_runs(self, tier: str | None = None) -> dict[str, RunRow]:
        """The most recent run of every cell (of a tier, if given)."""
        latest: dict[str, RunRow] = {}
        for run in self.runs(tier=tier):
            latest[run.cell_id] = run
        return dict(sorted(latest.items()))

    def results(
        self,
        run_id: str | None = None,
        cell_id: str | None = None,
        verdicts: Sequence[str] | None = None,
        since: str | None = None,
    ) -> list[ResultRow]:
        """Results in history order, then test id; `since` keeps runs started at or after it."""
        sql = "SELECT r.* FROM results r JOIN runs u USING (run_id) WHERE 1=1"
        args: list[Any] = []
        if since is not None:
            sql, args = sql + " AND u.started_at >= ?", args + [since]
        if run_id is not None:
            sql, args = sql + " AND r.run_id = ?", args + [run_id]
        if cell_id is not None:
            sql, args = sql + " AND r.cell_id = ?", args + [cell_id]
        if verdicts is not None:
            sql += f" AND r.verdict IN ({','.join('?' * len(verdicts))})"
            args += list(verdicts)
        rows = self.conn.execute(sql + " ORDER BY u.started_at, u.run_id, r.test_id", args)
        return [self._result_row(r) for r in rows]

    def bisects(self) -> list[BisectRow]:
        rows = self.conn.execute("SELECT * FROM bisects ORDER BY created_at DESC, test_id")
        return [BisectRow(**dict(r)) for r in rows]

    def fix_audit(self) -> list[FixAuditRow]:
        rows = self.conn.execute("SELECT * FROM fix_audit ORDER BY fix, version, cell_id")
        return [FixAuditRow(**dict(r)) for r in rows]

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """Every answer the store gives, without ingest bookkeeping (paths, times).

        Two stores built from the same files in any order have equal snapshots.
        """
        runs = [asdict(r) for r in self.runs()]
        for r in runs:
            r.pop("source_path")
        return {
            "runs": runs,
            "results": [asdict(r) for r in self.results()],
            "bisects": [asdict(b) for b in self.bisects()],
            "fix_audit": [{k: v for k, v in asdict(a).items() if k != "source_path"} for a in self.fix_audit()],
        }

    @staticmethod
    def _run_row(r: sqlite3.Row) -> RunRow:
        d = dict(r)
        stack = json.loads(d.pop("stack_json"))
        for k in ("content_size", "meta_hash", "ingested_at"):
            d.pop(k)
        return RunRow(stack=stack, **d)

    @staticmethod
    def _result_row(r: sqlite3.Row) -> ResultRow:
        d = dict(r)
        d["rerun_outcomes"] = json.loads(d["rerun_outcomes"])
        return ResultRow(**d)


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def read_fix_audit(path: Path) -> list[FixAuditRow]:
    """Rows of a fix audit file: a list of rows, or {"rows": [...]} with optional
    top-level `cell_id`/`version` defaults. Each row: fix, version, present, applied,
    off, on, verdict (booleans are shown as yes/no)."""
    data = _read_json(Path(path))
    defaults = data if isinstance(data, dict) else {}
    rows = data.get("rows", []) if isinstance(data, dict) else data
    out = []
    for row in rows:
        if not isinstance(row, dict) or "fix" not in row:
            raise StoreError("a fix audit row needs at least `fix`", where=str(path))
        out.append(
            FixAuditRow(
                fix=str(row["fix"]),
                version=str(row.get("version", defaults.get("version", ""))),
                present=_text(row.get("present")),
                applied=_text(row.get("applied")),
                off=_text(row.get("off")),
                on=_text(row.get("on")),
                verdict=_text(row.get("verdict")),
                cell_id=str(row.get("cell_id", defaults.get("cell_id", ""))),
                source_path=str(path),
            )
        )
    return out


def read_bisect(path: Path) -> list[BisectRow]:
    """Rows of a bisect report: one object (or a list) with test_id, axis, good, bad and
    optionally culprit, cell_id, status, created_at. Other JSON files are ignored."""
    data = _read_json(Path(path))
    items = data if isinstance(data, list) else [data]
    out = []
    for d in items:
        if not isinstance(d, dict) or not {"test_id", "axis", "good", "bad"} <= d.keys():
            continue
        out.append(
            BisectRow(
                test_id=str(d["test_id"]),
                axis=str(d["axis"]),
                good=str(d["good"]),
                bad=str(d["bad"]),
                culprit=_text(d.get("culprit")),
                report_path=str(d.get("report_path") or path),
                cell_id=str(d.get("cell_id", "")),
                status=str(d.get("status", "")),
                created_at=str(d.get("created_at", "")),
            )
        )
    return out


def ingest(paths: Iterable[Path | str], store_path: Path | str | None = None) -> IngestReport:
    """Indexes run directories (or parents of many) into the store; idempotent."""
    with Store(store_path) as store:
        return store.ingest(paths)


def rebuild(
    store_path: Path | str | None = None,
    runs_root: Path | str | None = None,
    *,
    audit_dir: Path | str | None = None,
    bisect_dir: Path | str | None = None,
) -> IngestReport:
    """Deletes the store and re-indexes it from the files; same answers as before.

    The new index is built beside the old one and moved into place, so a failed
    rebuild leaves the old store. Do not run it while another process ingests.
    """
    store_path = Path(store_path) if store_path is not None else default_store_path()
    runs_root = Path(runs_root) if runs_root is not None else DEFAULT_RUNS_ROOT
    audit_dir = Path(audit_dir) if audit_dir is not None else DEFAULT_AUDIT_DIR
    bisect_dir = Path(bisect_dir) if bisect_dir is not None else DEFAULT_BISECT_DIR
    tmp = store_path.with_name(store_path.name + ".rebuild")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp}{suffix}").unlink(missing_ok=True)
    with Store(tmp) as store:
        report = store.ingest([runs_root]) if runs_root.exists() else IngestReport()
        if audit_dir.is_dir():
            store.import_fix_audit(audit_dir)
        if bisect_dir.is_dir():
            store.import_bisects(bisect_dir)
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        store.conn.execute("PRAGMA journal_mode = DELETE")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store_path}{suffix}").unlink(missing_ok=True)
    os.replace(tmp, store_path)
    return report


# ------------------------------------------------------------------- CLI


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers `ingest` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "ingest",
        help="index run directories into the results store",
        description="Index run directories (or parents holding many) into the SQLite store. "
        "Idempotent; safe to run from many processes at once.",
    )
    p.add_argument(
        "paths", nargs="*", type=Path, help=f"run directories or parents of many (default {DEFAULT_RUNS_ROOT})"
    )
    p.add_argument("--store", type=Path, default=None, help=f"store file (default ${STORE_ENV} or {DEFAULT_STORE})")
    p.add_argument("--rebuild", action="store_true", help="delete the store and re-index it from the files")
    p.add_argument("--audit-dir", type=Path, default=DEFAULT_AUDIT_DIR, help="fix audit JSON files to index")
    p.add_argument("--bisect-dir", type=Path, default=DEFAULT_BISECT_DIR, help="bisect report JSON files to index")
    p.set_defaults(fn=run)
    return p


def run(args: argparse.Namespace) -> int:
    if args.rebuild:
        if len(args.paths) > 1:
            raise StoreError("--rebuild takes one runs root")
        root = args.paths[0] if args.paths else DEFAULT_RUNS_ROOT
        report = rebuild(args.store, root, audit_dir=args.audit_dir, bisect_dir=args.bisect_dir)
    else:
        with Store(args.store) as store:
            report = store.ingest(args.paths or [DEFAULT_RUNS_ROOT])
            if args.audit_dir.is_dir():
                store.import_fix_audit(args.audit_dir)
            if args.bisect_dir.is_dir():
                store.import_bisects(args.bisect_dir)
    print(report.summary())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m distci.store` is `python -m distci ingest`."""
    from .cli import main_for

    return main_for("ingest", argv)


if __name__ == "__main__":
    sys.exit(main())
