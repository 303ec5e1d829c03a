"""The store: a SQLite index over the per-run JSONL files, rebuildable at any time.

The JSONL files under `.distci/runs/<run-id>/` are the source of truth (distci.results):
appended while a run goes, never rewritten. This module indexes them so the gate, the
dashboard and the export can ask questions across runs, cells and nights without
re-reading every file. Deleting the SQLite file loses nothing: `rebuild` re-indexes the
same files and gives the same answers.

Writes are safe from many processes at once (artifacts of many runners arrive together):
the database is in WAL mode, each write holds one `BEGIN IMMEDIATE` transaction and
waits for others at most DISTCI_STORE_LOCK_TIMEOUT seconds (default 60), then fails
naming the holder (each writer records pid, host and command in `<store>.writer`).
Reading run directories into it is distci.judge.ingest's job (its rows, text losslessly:
distci.judge.resultrows); judging again only the results a landed run can change is
distci.judge.rejudge's.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence


from distci.judge.rejudge import Landing, Memo, rejudge_cells, rejudge_tail
from distci.judge.storelock import LOCK_TIMEOUT_ENV, WRITER_SUFFIX, claim, holder_of, lock_timeout_s, release
from distci.errors import StoreError
from distci.judge.rows import BisectRow, FixAuditRow, ResultRow, RunRow
from distci.stack import Stack

SCHEMA_VERSION = 5
# 2: runs keep run.json's ci block and image (links need no run directory); 3: selection;
# 4: results carry their run's start; 5: no (cell, test) history index: every run dirtied a
# page of it per test, four fifths of a year-sized ingest's writes (history is read by run)
_MIGRATIONS = {
    1: ("ALTER TABLE runs ADD COLUMN ci_json TEXT NOT NULL DEFAULT '{}'", "ALTER TABLE runs ADD COLUMN image TEXT"),
    2: ("ALTER TABLE runs ADD COLUMN selection_json TEXT NOT NULL DEFAULT '[]'",),
    3: ("ALTER TABLE results ADD COLUMN run_started_at TEXT NOT NULL DEFAULT ''",
        "UPDATE results SET run_started_at = (SELECT started_at FROM runs WHERE runs.run_id = results.run_id)",
        "DROP INDEX IF EXISTS results_by_cell"),
    4: ("DROP INDEX IF EXISTS results_history",),
}
"""Schema upgrades in place: the statements that take a store of version N to N + 1."""
DEFAULT_STORE = Path(".distci") / "store.sqlite"
DEFAULT_RUNS_ROOT = Path(".distci") / "runs"
DEFAULT_AUDIT_DIR = Path(".distci") / "audit"
DEFAULT_BISECT_DIR = Path(".distci") / "bisect"
STORE_ENV = "DISTCI_STORE"
CACHE_KIB = 256 * 1024
"""SQLite's page cache per connection (its default is 2 MiB): at a year the indexes an
ingest updates are hundreds of MB, and a cache miss is a read from disk."""
CHECKPOINT_PAGES = 16384
"""WAL pages (64 MiB at 4 KiB) before a commit copies them into the database (SQLite's
default is 1000). Each checkpoint syncs the file; at the default a backfill checkpointed
every other run and spent a third of its wall time waiting on those syncs (docs/benchmarks.md
"Benchmarks"). An ingest checkpoints once more at its end (Store.checkpoint)."""
CHECKED_SUFFIX = ".checked"
"""Beside the store: its file's inode, size and times when a Store last closed it. An open
that finds the file so skips quick_check (10 ms per MiB: 6 s at a year's 574 MB); any other
change to the file (a write that is not ours) makes the next open check it again."""
WAL_KEEP_BYTES = 64 * 1024 * 1024
"""The WAL file is cut back to this after a checkpoint, not left at its largest."""


def default_store_path() -> Path:
    """DISTCI_STORE if set, else .distci/store.sqlite under the current directory."""
    return Path(os.environ.get(STORE_ENV) or DEFAULT_STORE)


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
        ingested_at TEXT NOT NULL DEFAULT '',
        ci_json TEXT NOT NULL DEFAULT '{}',
        image TEXT,
        selection_json TEXT NOT NULL DEFAULT '[]'
    )""",
    "CREATE INDEX IF NOT EXISTS runs_by_cell ON runs(cell_id, started_at)",
    # A cell's baselines and the cells taking it as one, asked at every run that lands (rejudge).
    "CREATE INDEX IF NOT EXISTS runs_by_baseline ON runs(cell_id, baseline_cell)",
    "CREATE INDEX IF NOT EXISTS runs_by_dependent ON runs(baseline_cell, cell_id)",
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
        run_started_at TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (run_id, test_id)
    )""",
    "CREATE INDEX IF NOT EXISTS results_by_verdict ON results(verdict)",
    # Covers the dashboard's verdict counts (heat.verdict_counts): one pass over a year by index.
    "CREATE INDEX IF NOT EXISTS results_by_run_verdict ON results(run_id, verdict)",
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


_IOERR, _CORRUPT, _FULL, _NOTADB = 10, 11, 13, 26
_STORAGE_CODES = {_IOERR, _CORRUPT, _FULL, _NOTADB}
"""SQLite's primary result codes for a disk or file that failed (sqlite.org/rescode.html)."""


class Store:
    """An open store. Use as a context manager; every method is one short transaction.

    Checked before it is trusted: an existing file passes SQLite's `quick_check` (page and
    index structure) on open, so a damaged store is one StoreError naming it, never read as
    answers. `reading=True` holds one read transaction from open to close: every answer of a
    reader (gate, dashboard, export) comes from one snapshot, whatever an ingest commits
    meanwhile. Any SQLite error inside the `with` block (damage met later, a full disk) leaves
    it as one StoreError naming the file and what to do.
    """

    def __init__(self, path: Path | str | None = None, *, reading: bool = False) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock_timeout_s = lock_timeout_s()
        self.writer_file = self.path.with_name(self.path.name + WRITER_SUFFIX)
        existed = self.path.exists() and self.path.stat().st_size > 0
        self.checked_file = self.path.with_name(self.path.name + CHECKED_SUFFIX)
        # Short waits inside SQLite; the overall bound is _retry_locked's deadline.
        self.conn = sqlite3.connect(str(self.path), timeout=min(self.lock_timeout_s, 1.0), isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.memo = Memo()
        try:
            if existed and not self._unchanged_since_checked():
                self._check()
            self._setup()
            if reading:
                self.conn.execute("BEGIN")
                self.conn.execute("SELECT count(*) FROM runs").fetchone()  # the snapshot starts here
        except BaseException as exc:
            self.conn.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise self.failure(exc) from None
            raise

    def _file_state(self) -> str:
        st = self.path.stat()
        return f"{st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"

    def _unchanged_since_checked(self) -> bool:
        """Whether the file is as the last Store to close it left it (CHECKED_SUFFIX)."""
        try:
            return self.checked_file.read_text() == self._file_state()
        except OSError:
            return False

    def _check(self) -> None:
        """SQLite's quick_check: the structure of every page and index, without comparing
        index contents to tables (the full integrity_check's cost)."""
        found = [" ".join(str(row[0]).split()) for row in self.conn.execute("PRAGMA quick_check(3)")]
        if found != ["ok"]:
            raise StoreError(f"the store is damaged (SQLite quick_check: {'; '.join(found)}); it is an index of the "
                             "run directories: delete it and run `nox -s ingest -- --rebuild`", where=str(self.path))

    @staticmethod
    def storage_failed(exc: BaseException) -> bool:
        """Whether a SQLite error is the disk's or the file's (full, unwritable, damaged): no
        later run can land either, so the command stops on it rather than skip run by run."""
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(exc, sqlite3.DatabaseError) and code is not None and code & 0xFF in _STORAGE_CODES

    def failure(self, exc: sqlite3.DatabaseError) -> StoreError:
        """What a SQLite error means to the person running the command: a disk that cannot
        take the write (named, with its free space), or a store that is not one (rebuild it)."""
        text = str(exc)
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if code in (_FULL, _IOERR) or "disk is full" in text:
            try:
                free = f"{shutil.disk_usage(self.path.parent).free // 2**20} MiB free"
            except OSError:
                free = "free space unknown"
            what = "is full" if code == _FULL else "did not take a write (full, a file-size limit, or failing)"
            return StoreError(f"the disk holding the store {what} ({free} there; SQLite: {text}); the transaction was "
                              f"rolled back: free space on that disk or set {STORE_ENV} to a path on another, then "
                              "run the command again", where=str(self.path))
        return StoreError(f"the store is damaged or not a store (SQLite: {text}); it is an index of the run directories: delete it "
                          "and run `nox -s ingest -- --rebuild`", where=str(self.path))

    def _setup(self) -> None:
        self.conn.execute(f"PRAGMA busy_timeout = {int(min(self.lock_timeout_s, 1.0) * 1000)}")
        self._retry_locked(lambda: self.conn.execute("PRAGMA journal_mode = WAL"))
        self.conn.execute("PRAGMA foreign_keys = ON")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        self.conn.execute("PRAGMA temp_store = MEMORY")
        self.conn.execute(f"PRAGMA wal_autocheckpoint = {CHECKPOINT_PAGES}")
        self.conn.execute(f"PRAGMA journal_size_limit = {WAL_KEEP_BYTES}")
        with self.transaction():
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            while version in _MIGRATIONS:
                for stmt in _MIGRATIONS[version]:
                    self.conn.execute(stmt)
                version += 1
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

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        failed = isinstance(exc, sqlite3.DatabaseError)
        try:
            self.close(trusted=not failed)
        except sqlite3.DatabaseError:
            pass
        if failed:
            raise self.failure(exc) from None

    def close(self, *, trusted: bool = True) -> None:
        """Closes the connection, then notes the file's state as checked (`trusted`: it
        passed quick_check at open, or was unchanged since, and only SQLite wrote it since);
        a store that failed a query is not noted, and loses its note."""
        self.conn.close()
        try:
            if not trusted:
                self.checked_file.unlink(missing_ok=True)
                return
            tmp = self.checked_file.with_name(self.checked_file.name + ".tmp")
            tmp.write_text(self._file_state())
            os.replace(tmp, self.checked_file)
        except OSError:
            pass

    def _retry_locked(self, fn: Any) -> Any:
        """Runs `fn`, retrying while another writer holds the store, for at most
        lock_timeout_s; then a StoreError that names the holder (pid, host, command, since)."""
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"the store is locked by another writer ({self.holder()}); gave up after "
                        f"{self.lock_timeout_s:g} s (set {LOCK_TIMEOUT_ENV} to wait longer, or stop that process)",
                        where=str(self.path),
                    ) from None
                time.sleep(0.05)

    def holder(self) -> str:
        """Who holds the write lock, as its writer file says (every transaction writes one)."""
        return holder_of(self.writer_file)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front so two
        ingests never both read, then both fail to upgrade (_retry_locked bounds the wait)."""
        self._retry_locked(lambda: self.conn.execute("BEGIN IMMEDIATE"))
        claim(self.writer_file)
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            release(self.writer_file)
            raise
        try:
            self._retry_locked(lambda: self.conn.execute("COMMIT"))
        finally:
            release(self.writer_file)

    def checkpoint(self) -> None:
        """Copies the WAL into the database now, as far as readers allow (PASSIVE: it never
        waits on them): what an ingest does at its end, so the store file is whole without
        this connection and the next reader does not walk a long WAL."""
        self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    # -------------------------------------------------------------- verdicts

    def recompute_verdicts(self, cells: Iterable[str] | None = None) -> None:
        """Recomputes the verdicts of the given cells (all cells by default) from their whole history."""
        with self.transaction() as conn:
            wanted = set(cells) if cells is not None else {r[0] for r in conn.execute("SELECT cell_id FROM runs")}
            rejudge_cells(conn, wanted)

    def rejudge_from(self, conn: sqlite3.Connection, cell: str, since: tuple[str, str],
                     tests: set[str] | None = None, landing: Landing | None = None) -> int:
        """Judges again only what a run landing at `since` ((started_at, run_id)) in `cell`
        can change, inside an open transaction (distci.judge.rejudge.rejudge_tail); a
        `landing` run's results are written through it, verdicts and all."""
        return rejudge_tail(conn, cell, since, tests, memo=self.memo, landing=landing)

    # ------------------------------------------------------- bisects, audits

    def add_bisects(self, rows: Iterable[BisectRow]) -> None:
        with self.transaction() as conn:
            conn.executemany(
                """INSERT OR REPLACE INTO bisects (test_id, axis, good, bad, culprit, report_path, cell_id,
                    status, created_at) VALUES (?,?,?,?,?,?,?,?,?)""",
                [
                    (b.test_id, b.axis, b.good, b.bad, b.culprit, b.report_path, b.cell_id, b.status, b.created_at)
                    for b in rows
                ],
            )

    def add_fix_audit(self, rows: Iterable[FixAuditRow]) -> None:
        with self.transaction() as conn:
            conn.executemany(
                """INSERT OR REPLACE INTO fix_audit (fix, version, present, applied, "off", "on", verdict,
                    cell_id, source_path) VALUES (?,?,?,?,?,?,?,?,?)""",
                [
                    (a.fix, a.version, a.present, a.applied, a.off, a.on, a.verdict, a.cell_id, a.source_path)
                    for a in rows
                ],
            )

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
        test_prefix: str | None = None,
    ) -> list[ResultRow]:
        """Results in history order, then test id; `since` keeps runs started at or after it,
        `test_prefix` the test ids starting so (a range on the primary key, not a scan)."""
        sql = "SELECT r.* FROM results r JOIN runs u USING (run_id) WHERE 1=1"
        args: list[Any] = []
        if since is not None:
            sql, args = sql + " AND u.started_at >= ?", args + [since]
        if run_id is not None:
            sql, args = sql + " AND r.run_id = ?", args + [run_id]
        if cell_id is not None:
            sql, args = sql + " AND r.cell_id = ?", args + [cell_id]
        if test_prefix:
            sql, args = sql + " AND r.test_id >= ? AND r.test_id < ?", args + [test_prefix, test_prefix + "\U0010ffff"]
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
        runs = [{**asdict(r), "stack": r.stack.to_dict()} for r in self.runs()]
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
        stack = _stored_json(d, "stack_json", "{}")
        d["ci"] = _stored_json(d, "ci_json", "{}")
        d["selection"] = _stored_json(d, "selection_json", "[]")
        for k in ("content_size", "meta_hash", "ingested_at"):
            d.pop(k)
        if not isinstance(stack, dict):
            raise StoreError(f"run {d.get('run_id')!r}: its stored stack_json is not a JSON object; the store is an "
                             "index of the run directories: delete it and run `nox -s ingest -- --rebuild`")
        return RunRow(stack=Stack.from_dict(stack), **d)

    @staticmethod
    def _result_row(r: sqlite3.Row) -> ResultRow:
        d = dict(r)
        d["rerun_outcomes"] = _stored_json(d, "rerun_outcomes", "[]")
        d.pop("run_started_at", None)  # the run's started_at, kept beside each result (schema 4)
        return ResultRow(**d)


def _stored_json(row: dict[str, Any], column: str, empty: str) -> Any:
    """A JSON column of a stored row, popped from it; a value distci never writes (the file
    edited by hand, or damaged where quick_check does not look) is a StoreError naming the run."""
    text = row.pop(column) or empty
    try:
        return json.loads(text)
    except (ValueError, TypeError, RecursionError):
        raise StoreError(f"run {row.get('run_id')!r}: its stored {column} is not JSON; the store is an index of the "
                         "run directories: delete it and run `nox -s ingest -- --rebuild`") from None
