"""Ingest: run directories (and bisect / fix-audit reports) into the store.

Damage stays where it is: a results.jsonl line that is not a Result is counted and
reported with its file:line, a run directory that cannot be read as a run is rejected on
its own (by path, with why), and every good run is indexed. `ingest` ends with a summary
of what it skipped.

A run already indexed with the same content is skipped. A run whose results.jsonl grew
(it was ingested while it was still being appended to) is re-indexed: the old content is
a prefix of the new one, which is what append-only allows. A run whose indexed content is
NOT a prefix of the new file was rewritten, which the format forbids; that run is
reported by id and path (StoreError, after everything else is indexed) and left as it was.

Known issues are matched here as well as when results are recorded (rule: one registry,
suites/known_issues.toml): editing the registry and running `ingest --rebuild` re-judges
every stored run. Runs land oldest first, each judged where it can change verdicts and nowhere
else (distci.judge.rejudge): tonight's ingest costs tonight's results, not the history's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sqlite3
import sys
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from distci.errors import StoreError
from distci.results import write_junit
from distci.rundir import JUNIT_FILE, RESULTS_FILE, RunContents, RunDir, RunDirError, find_run_dirs, read_run, utc
from distci.judge.store import DEFAULT_AUDIT_DIR, DEFAULT_BISECT_DIR, DEFAULT_RUNS_ROOT, DEFAULT_STORE, STORE_ENV, Store, default_store_path
from distci.judge.rejudge import baselines_of
from distci.judge.resultrows import insert_results, landing, storable
from distci.judge.runreader import PreparedRun, Unreadable, load_known_issues, prepared_runs, sha256
from distci.judge.rows import BisectRow, FixAuditRow
from distci.sources import nightly_date_of

DEFAULT_KNOWN_ISSUES = Path("suites") / "known_issues.toml"
SHOWN_PROBLEMS = 20


@dataclass
class IngestReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    """Run directories not indexed, each as `path: why`."""
    bad_lines: list[str] = field(default_factory=list)
    """results.jsonl lines not indexed, each as `file:line: why`."""
    results: int = 0
    junit: list[str] = field(default_factory=list)
    """Runs whose junit.xml was rewritten from the judged verdicts (--junit)."""

    def summary(self) -> str:
        text = (
            f"{len(self.added)} runs added, {len(self.updated)} re-indexed, "
            f"{len(self.skipped)} unchanged, {self.results} results indexed"
        )
        if self.conflicts:
            text += f", {len(self.conflicts)} rejected as rewritten"
        if self.junit:
            text += f", {len(self.junit)} junit.xml rewritten from the verdicts"
        if not (self.rejected or self.bad_lines):
            return text
        text += f"; skipped {len(self.rejected)} unreadable runs and {len(self.bad_lines)} bad lines:"
        shown = [*self.rejected, *self.bad_lines]
        lines = [f"  {p}" for p in shown[:SHOWN_PROBLEMS]]
        if len(shown) > SHOWN_PROBLEMS:
            lines.append(f"  ... and {len(shown) - SHOWN_PROBLEMS} more")
        return "\n".join([text, *lines])


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextmanager
def _cycles_uncollected() -> Iterator[None]:
    """Python's cycle collector off while one run is read, indexed and judged: a run is
    thousands of acyclic objects (its parsed lines), and each few hundred allocated would
    otherwise start a collection that scans the cells' judged state the store keeps
    (rejudge.Memo) again: a fifth of a backfill's CPU. It runs again between runs."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _history_order(dirs: list[Path]) -> list[Path]:
    """Run directories oldest first (run.json's start, then run id; a run without a
    readable run.json sorts first): landing in history order, each run's verdicts are
    judged once, as the newest of its cell."""
    def key(d: Path) -> tuple[str, str]:
        info = RunDir(d).read_info()
        return (utc(info.started_at), info.run_id) if info is not None else ("", d.name)
    return sorted(dirs, key=key)


def ingest_runs(store: Store, paths: Iterable[Path | str], *, known_issues: Path | None = None,
                defer_verdicts: bool = False, rewrite_junit: bool = False) -> IngestReport:
    """Indexes every run directory under `paths` into `store`, each in its own transaction
    with the verdicts it changes (distci.judge.rejudge: its cell's results from its place in
    history on, for its tests, and those of the cells taking its cell as baseline);
    idempotent. Runs land one at a time, oldest first, so memory holds a few runs (read
    ahead by distci.judge.runreader's reader process on a long ingest) and a backfill
    judges each result once. `defer_verdicts` recomputes verdicts once at the end,
    from the whole history, instead (a rebuild into a fresh file, which is only moved into
    place when whole). `rewrite_junit` rewrites each indexed run's junit.xml from its judged
    verdicts (see rewrite_run_junit), so JUnit says what the gate, dashboard and HUD export say.

    Raises StoreError after indexing everything else when some runs contradict what is
    already indexed (their JSONL was rewritten); `exc.report` has the report.
    """
    report = IngestReport()
    registry = load_known_issues(known_issues)
    problems: list[str] = []
    touched: set[str] = set()
    indexed: list[Path] = []
    dirs = _history_order(find_run_dirs(Path(p) for p in paths))
    with closing(prepared_runs(dirs, registry, known_issues)) as runs:  # the reader stops with the loop, however
        for prepared in runs:
            with _cycles_uncollected():
                landed = _land(store, prepared, report, problems, defer_verdicts=defer_verdicts)
            if landed is not None:
                indexed.append(landed[0])
                if landed[2] != "skipped":
                    touched.add(landed[1])
    if defer_verdicts and touched:
        store.recompute_verdicts(touched)
    if touched:
        store.checkpoint()
    if rewrite_junit:
        for d in indexed:
            try:
                run = read_run(d)
                rewrite_run_junit(store, run)
                report.junit.append(run.info.run_id)
            except (OSError, RunDirError) as exc:
                report.rejected.append(f"{d / JUNIT_FILE}: not rewritten ({exc})")
    if problems:
        err = StoreError("; ".join(problems) + " (JSONL files are never rewritten: give the run a new id)")
        err.report = report  # type: ignore[attr-defined]
        raise err
    return report


def _land(store: Store, run: PreparedRun | Unreadable, report: IngestReport, problems: list[str], *,
          defer_verdicts: bool) -> tuple[Path, str, str] | None:
    """Indexes one read run (runreader.prepare) in one transaction, with the verdicts it
    changes; records what happened in `report` (a rewritten run in `problems` too). The
    run's directory, cell and state (added, updated, skipped) when it is in the store, else
    None; not the run: its rows are freed before the cycle collector runs again."""
    report.bad_lines += run.problems
    if isinstance(run, Unreadable):
        report.rejected.append(run.why)
        return None
    # One transaction per run: a run that cannot be indexed is reported by its path and
    # why, and every other run of the call still lands (the nightly ingests all at once).
    try:
        with store.transaction() as conn:
            state, since, tests, rows = _index_run(conn, run)
            if state == "conflict":
                row = conn.execute("SELECT source_path FROM runs WHERE run_id = ?", (run.info.run_id,)).fetchone()
            elif state != "skipped" and defer_verdicts:
                insert_results(conn, rows, {})
            elif state != "skipped":
                store.rejudge_from(conn, run.info.cell_id, since, tests, landing=landing(conn, run.info.run_id, rows))
    except (sqlite3.Error, ValueError, TypeError) as exc:
        if Store.storage_failed(exc):  # a full disk or a damaged file: no later run lands either
            raise store.failure(exc) from None
        report.rejected.append(f"{run.path}: not indexed ({type(exc).__name__}: {exc})")
        return None
    if state == "conflict":
        problems.append(
            f"run {run.info.run_id}: {run.path / RESULTS_FILE} is not an append-only "
            f"continuation of the indexed {row['source_path']}/{RESULTS_FILE}"
        )
        report.conflicts.append(run.info.run_id)
        return None
    getattr(report, state).append(run.info.run_id)
    if state != "skipped":
        report.results += len(run.rows)
    return run.path, run.info.cell_id, state


def _index_run(conn: sqlite3.Connection, run: PreparedRun) -> tuple[str, tuple[str, str], set[str] | None, list[tuple]]:
    """Indexes one run's runs row: its state (added, updated, skipped, conflict), the earliest
    place in history its (re-)indexing changed, the tests whose verdicts it can change there
    (None: all, when the run changed the set of baseline cells its cell declares), and its
    results rows, not written yet (they are written with their verdicts: resultrows.landing)."""
    info = run.info
    content_hash, meta_hash = run.content_hash, run.meta_hash
    since = (info.started_at, info.run_id)
    tests = set(run.tests)
    old = conn.execute(
        "SELECT content_hash, content_size, meta_hash, started_at FROM runs WHERE run_id = ?", (info.run_id,)
    ).fetchone()
    baselines = set(baselines_of(conn, info.cell_id))
    if old is not None:
        if old["content_hash"] == content_hash and old["meta_hash"] == meta_hash:
            return "skipped", since, tests, []
        prefix = run.raw[: old["content_size"]]
        if len(run.raw) < old["content_size"] or sha256(prefix) != old["content_hash"]:
            return "conflict", since, tests, []
        # A new run.json may move the run in history: judge again from the earlier place.
        since = min(since, (old["started_at"], info.run_id))
        tests |= {r[0] for r in conn.execute("SELECT test_id FROM results WHERE run_id = ?", (info.run_id,))}
        conn.execute("DELETE FROM runs WHERE run_id = ?", (info.run_id,))
    conn.execute(
        """INSERT INTO runs (run_id, cell_id, started_at, ended_at, runner, backend, image_digest,
            tier, nightly_date, baseline_cell, torch_git, stack_json, source_path, content_hash,
            content_size, meta_hash, n_results, ingested_at, ci_json, image, selection_json)
           VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
        tuple(storable(v) if isinstance(v, str) else v for v in (
            info.run_id, info.cell_id, info.started_at, info.ended_at, info.runner, info.backend,
            info.image_digest, info.tier or "", info.nightly_date or nightly_date_of(run.stack.torch),
            info.baseline_cell, run.stack.torch_git, json.dumps(run.stack.to_dict(), sort_keys=True, default=str),
            str(run.path.resolve()), content_hash, len(run.raw), meta_hash, len(run.rows), _now(),
            json.dumps(info.ci or {}, sort_keys=True, default=str), info.image, json.dumps(info.selection or []),
        )),
    )
    rows = run.rows
    if set(baselines_of(conn, info.cell_id)) != baselines:  # every run of the cell falls back to its baselines
        since, tests = ("", ""), None
    return ("added" if old is None else "updated"), since, tests, rows


def rewrite_run_junit(store: Store, run: RunContents) -> Path:
    """The run's junit.xml again, from its Results and the store's judgement of them: a
    known issue the registry matches today is skipped with its id (and one it no longer
    matches is a failure again), a failure judged flaky from history is a flakyFailure."""
    rows = {r.test_id: r for r in store.results(run_id=run.info.run_id)}
    results = [replace(r, known_issue=rows[r.test_id].known_issue) if r.test_id in rows else r for r in run.results]
    verdicts = {t: row.verdict for t, row in rows.items()}
    return write_junit(results, run.path / JUNIT_FILE, suite_name=run.info.cell_id, verdicts=verdicts)


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise StoreError(f"not valid JSON ({str(exc)[:200] or type(exc).__name__})", where=str(path)) from None
    except OSError as exc:
        raise StoreError(f"cannot read it ({exc.strerror or exc})", where=str(path)) from None


def read_fix_audit(path: Path) -> list[FixAuditRow]:
    """Rows of a fix audit file: a list of rows, or {"rows": [...]} with optional
    top-level `cell_id`/`version` defaults. Each row: fix, version, present, applied,
    off, on, verdict (booleans are shown as yes/no)."""
    data = _read_json(Path(path))
    defaults = data if isinstance(data, dict) else {}
    rows = data.get("rows", []) if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise StoreError("a fix audit file is a list of rows or {\"rows\": [...]}", where=str(path))
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


def ingest(
    paths: Iterable[Path | str], store_path: Path | str | None = None, *, known_issues: Path | None = None
) -> IngestReport:
    """Indexes run directories (or parents of many) into the store; idempotent."""
    with Store(store_path) as store:
        return ingest_runs(store, paths, known_issues=known_issues)


def rebuild(
    store_path: Path | str | None = None,
    runs_root: Path | str | None = None,
    *,
    audit_dir: Path | str | None = None,
    bisect_dir: Path | str | None = None,
    known_issues: Path | None = None,
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
        report = (ingest_runs(store, [runs_root], known_issues=known_issues, defer_verdicts=True)
                  if runs_root.exists() else IngestReport())
        if audit_dir.is_dir():
            import_fix_audit(store, audit_dir)
        if bisect_dir.is_dir():
            import_bisects(store, bisect_dir)
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
    p.add_argument("--junit", action="store_true",
                   help="rewrite each run's junit.xml from the judged verdicts (known issues skipped with their id, "
                        "flaky failures as flakyFailure), so JUnit says what the gate says")
    p.add_argument("--known-issues", type=Path, default=DEFAULT_KNOWN_ISSUES,
                   help=f"registry matched at index time (default {DEFAULT_KNOWN_ISSUES}; ignored when absent)")
    p.set_defaults(fn=run)
    return p


def run(args: argparse.Namespace) -> int:
    registry = args.known_issues if args.known_issues.exists() else None
    if args.rebuild:
        if len(args.paths) > 1:
            raise StoreError("--rebuild takes one runs root")
        root = args.paths[0] if args.paths else DEFAULT_RUNS_ROOT
        report = rebuild(args.store, root, audit_dir=args.audit_dir, bisect_dir=args.bisect_dir, known_issues=registry)
    else:
        with Store(args.store) as store:
            report = ingest_runs(store, args.paths or [DEFAULT_RUNS_ROOT], known_issues=registry,
                                 rewrite_junit=args.junit)
            if args.audit_dir.is_dir():
                import_fix_audit(store, args.audit_dir)
            if args.bisect_dir.is_dir():
                import_bisects(store, args.bisect_dir)
    print(report.summary())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m distci.judge.ingest` is `python -m distci ingest`."""
    from distci.command import run_module

    return run_module(add_parser, argv)


if __name__ == "__main__":
    sys.exit(main())


def import_fix_audit(store: Store, audit_dir: Path) -> int:
    """Indexes every `*.json` fix audit file of a directory (see read_fix_audit)."""
    rows = [row for p in sorted(Path(audit_dir).glob("*.json")) for row in read_fix_audit(p)]
    store.add_fix_audit(rows)
    return len(rows)


def import_bisects(store: Store, bisect_dir: Path) -> int:
    """Indexes every bisect report (`*.json`, any depth) of a directory (see read_bisect)."""
    rows = [row for p in sorted(Path(bisect_dir).rglob("*.json")) for row in read_bisect(p)]
    store.add_bisects(rows)
    return len(rows)
