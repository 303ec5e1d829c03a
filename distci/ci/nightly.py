"""The nightly aggregate, as explicit steps: each takes the previous step's result.

    collect(opts)            tonight's run directories, plus an `infra` run for each expected
                             cell that uploaded nothing (rule 4: infra, never a pass)
    record(opts, collected)  added to the history branch (append-only)
    judge(opts, recorded)    the store rebuilt from the whole history; tonight's regressions;
                             the dashboard rendered from it
    publish(opts, judged)    the history branch pushed (retried on a concurrent push)
    file(opts, published)    issues opened or updated, bisects dispatched; the report

`aggregate()` runs them in that order; a test or a rerun can stop after any step and
look at its result. `--dry-run` reads what it needs and prints what it would write,
push and dispatch. The `record` job of bisect.yml is `record_bisect()`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from distci.ci.actions import append_step_summary, workflow_run_url
from distci.provision.github import GitHub
from distci.ci.history import DATA_BRANCH, History, HistoryUpdate, cell_of, run_id_of
from distci.ci.ids import marker, now
from distci.ci.issues import FilingReport, Issue, Tracker, code, file_regressions
from distci.ci.regressions import BisectPlan, expected_cells, missing_cell_runs, regressions
from distci.judge.rows import Regression
from distci.errors import ConfigError, StoreError
from distci.judge.ingest import DEFAULT_KNOWN_ISSUES
from distci.rundir import RunDirError, find_run_dirs, read_run
from distci.judge.store import Store
from distci.judge.ingest import ingest_runs, import_bisects, rewrite_run_junit

Log = Callable[[str], None]


@dataclass
class AggregateReport:
    runs: list[str]
    history: HistoryUpdate
    regressions: list[dict[str, Any]]
    filing: FilingReport
    pushed: bool
    site: str | None
    missing: list[str]

    def to_markdown(self) -> str:
        lines = [
            "## distci aggregate",
            "",
            f"- runs: {len(self.runs)} ({len(self.history.added)} new to the history, "
            f"{len(self.history.refused)} refused), cells without results: {len(self.missing)}",
            f"- regressions: {len(self.regressions)}; issues opened {self.filing.opened or 'none'}, "
            f"updated {self.filing.updated or 'none'}; bisects dispatched: {len(self.filing.bisects)}",
        ]
        for r in self.regressions:
            lines.append(f"  - `{r['cell_id']}` :: `{r['test_id']}`: {r['signature']}")
        return "\n".join(lines) + "\n"


@dataclass
class AggregateOptions:
    artifacts: list[Path]
    data: Path
    data_remote: str | None = None
    data_branch: str = DATA_BRANCH
    store: Path = Path(".distci") / "aggregate" / "store.sqlite"
    site: Path | None = None
    expect: Path | None = None
    expect_cells: list[dict[str, Any]] | None = None
    tier: str = "nightly"
    dry_run: bool = False
    issues: bool = True
    ref: str = "main"
    repo: str | None = None
    api_url: str | None = None
    max_bisects: int = 4
    title: str = "distci"
    report: Path | None = None



@dataclass
class Collected:
    """Run directories (the infra runs of missing cells live in a scratch directory until recorded)."""

    run_dirs: list[Path]
    missing: list[Path]
    tonight: list[str]
    missing_cells: list[str]


@dataclass
class Recorded:
    collected: Collected
    history: History
    update: HistoryUpdate
    run_dirs: list[Path]


@dataclass
class Judged:
    recorded: Recorded
    found: list[Regression]
    site: str | None


@dataclass
class Published:
    judged: Judged
    pushed: bool


def collect(opts: AggregateOptions, scratch: Path, *, log: Log = print) -> Collected:
    """Tonight's run directories from the artifacts; an infra run for each expected cell missing."""
    run_dirs = find_run_dirs(opts.artifacts) if opts.artifacts else []
    missing: list[Path] = []
    expected = opts.expect_cells if opts.expect_cells is not None else (
        expected_cells(opts.expect) if opts.expect is not None else None)
    if expected is not None:
        reason = ("the runner died, timed out or the job was cancelled before the run started; "
                  f"see {workflow_run_url() or 'the workflow run'}")
        missing = missing_cell_runs(expected, {cell_of(d) for d in run_dirs}, scratch,
                                    tier=opts.tier, reason=reason)
    log(f"aggregate: {len(run_dirs) + len(missing)} runs in the artifacts, {len(missing)} cells without results")
    run_dirs += missing
    return Collected(run_dirs=run_dirs, missing=missing, tonight=[run_id_of(d) for d in run_dirs],
                     missing_cells=[cell_of(d) for d in missing])


def record(opts: AggregateOptions, collected: Collected, *, log: Log = print) -> Recorded:
    """Add the runs to the history checkout (a rerun does not add a second infra run for a missing cell)."""
    token = os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")
    history = History(opts.data, remote=opts.data_remote, branch=opts.data_branch, token=token, log=log)
    history.fetch()
    run_dirs = [d for d in collected.run_dirs
                if d not in collected.missing or not (history.runs_dir / d.name).exists()]
    update = history.add_runs(run_dirs)
    log(f"aggregate: history {history.path}: {len(update.added)} added, {len(update.grown)} grown, "
        f"{len(update.unchanged)} unchanged, {len(update.refused)} refused")
    return Recorded(collected=collected, history=history, update=update, run_dirs=run_dirs)


def judge(opts: AggregateOptions, recorded: Recorded, *, log: Log = print) -> Judged:
    """Index the whole history (verdicts need it), find tonight's regressions, render the dashboard."""
    history = recorded.history
    with Store(opts.store) as store:
        if history.runs_dir.is_dir():
            try:
                log("aggregate: store: " + ingest_runs(store, [history.runs_dir], known_issues=DEFAULT_KNOWN_ISSUES).summary())
            except StoreError as exc:
                log(f"aggregate: store: {exc}")
        if history.bisect_dir.is_dir():
            import_bisects(store, history.bisect_dir)
        rewritten = rewrite_artifact_junit(store, recorded.collected.run_dirs)
        log(f"aggregate: {rewritten} junit.xml of tonight's artifacts rewritten from the judged verdicts")
        from distci.known_issues import load_registry

        registry = load_registry(Path(DEFAULT_KNOWN_ISSUES)) if Path(DEFAULT_KNOWN_ISSUES).exists() else None
        found = regressions(store, recorded.collected.tonight, registry)
        site = None
        if opts.site is not None:
            from distci.dashboard import render_dashboard

            site = str(render_dashboard(store, opts.site, title=opts.title, audit_dir=None))
            log(f"aggregate: dashboard {site}")
    log(f"aggregate: {len(found)} regressions")
    return Judged(recorded=recorded, found=found, site=site)


def rewrite_artifact_junit(store: Store, run_dirs: list[Path]) -> int:
    """Tonight's junit.xml files (the ones the workflow's test reporter reads) rewritten from
    the store's verdicts, so an annotation is red exactly where the gate is: a known issue
    matched at index time is a skip with its id, a failure judged flaky a flakyFailure.
    A run the store did not index keeps its run-time file."""
    count = 0
    for run_dir in run_dirs:
        try:
            run = read_run(run_dir)
            if store.results(run_id=run.info.run_id):
                rewrite_run_junit(store, run)
                count += 1
        except (OSError, RunDirError):
            continue
    return count


def publish(opts: AggregateOptions, judged: Judged, *, log: Log = print) -> Published:
    """Push the history branch (after judging: a push that fails leaves the dashboard rendered)."""
    recorded = judged.recorded
    update, history = recorded.update, recorded.history
    if opts.dry_run:
        log(f"aggregate: would push {len(update.added) + len(update.grown)} runs to {opts.data_branch}")
        return Published(judged=judged, pushed=False)
    pushed = history.publish(f"distci: {len(update.added)} runs ({workflow_run_url() or 'local'})",
                             redo=lambda: history.add_runs(recorded.run_dirs))
    return Published(judged=judged, pushed=pushed)


def file(opts: AggregateOptions, published: Published, *, log: Log = print) -> AggregateReport:
    """Issues and bisects for tonight's regressions; the report (JSON, step summary)."""
    judged = published.judged
    filing = FilingReport()
    if opts.issues and judged.found:
        filing = file_regressions(judged.found, tracker(opts.repo, opts.api_url, opts.dry_run, log), ref=opts.ref,
                                  run_url=workflow_run_url(), max_bisects=opts.max_bisects)
    collected = judged.recorded.collected
    report = AggregateReport(runs=collected.tonight, history=judged.recorded.update,
                             regressions=[{"cell_id": g.cell_id, "test_id": g.test_id, "run_id": g.run_id,
                                           "signature": g.signature} for g in judged.found],
                             filing=filing, pushed=published.pushed, site=judged.site,
                             missing=collected.missing_cells)
    if opts.report is not None:
        opts.report.parent.mkdir(parents=True, exist_ok=True)
        opts.report.write_text(json.dumps(asdict(report), indent=1, default=str) + "\n")
    append_step_summary(report.to_markdown())
    return report


def aggregate(opts: AggregateOptions, *, log: Log = print) -> AggregateReport:
    """collect -> record -> judge -> publish -> file."""
    scratch = Path(tempfile.mkdtemp(prefix="distci-aggregate-"))
    try:
        collected = collect(opts, scratch, log=log)
        published = publish(opts, judge(opts, record(opts, collected, log=log), log=log), log=log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return file(opts, published, log=log)


def tracker(repo: str | None, api_url: str | None, dry_run: bool, log: Log) -> Tracker:
    try:
        github: GitHub | None = GitHub.from_env(repo, api_url)
    except ConfigError:
        if not dry_run:
            raise
        log("aggregate: no GitHub token or repository: planning as if no issue existed")
        github = None
    return Tracker(github, dry_run=dry_run, log=log)


def bisect_record(report_path: Path | None, *, test_id: str, axis: str, good: str, bad: str, cell_id: str,
                  run_url: str = "") -> dict[str, Any]:
    """The store's bisect record (store.read_bisect keys) of a bisect.yml run.

    A report of `distci bisect TEST_ID` carries that record at its top level (the
    narrowed good/bad and the culprit); it is kept, with the cell filled in. An older
    report without it, or no report at all (the bisect crashed, its runner died), is
    recorded from the question asked, with the status `error` when there is no report.
    """
    report: dict[str, Any] = {}
    if report_path is not None and Path(report_path).exists():
        report = json.loads(Path(report_path).read_text())
    if {"test_id", "axis", "good", "bad"} <= report.keys():
        record = dict(report)
        record["cell_id"] = record.get("cell_id") or cell_id
    else:
        first_bad = report.get("first_bad") if report.get("mode", "regression") == "regression" \
            else report.get("first_good")
        record = {**report, "test_id": test_id, "axis": axis, "good": good, "bad": bad, "cell_id": cell_id,
                  "culprit": first_bad, "status": report.get("kind", "error")}
    record["created_at"] = record.get("created_at") or now()
    if run_url:
        record["report_path"] = run_url
    record["asked"] = {"test_id": test_id, "axis": axis, "good": good, "bad": bad, "cell_id": cell_id}
    return record


def record_bisect(record: dict[str, Any], *, data: Path, data_remote: str | None, data_branch: str = DATA_BRANCH,
                  store: Path, issue: int | None, dry_run: bool, repo: str | None = None,
                  api_url: str | None = None, log: Log = print) -> Path:
    """Add a bisect record to the history, index it, and tell its issue what was found."""
    token = os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")
    history = History(data, remote=data_remote, branch=data_branch, token=token, log=log)
    history.fetch()
    path = history.add_bisect(record)
    with Store(store) as db:
        if not import_bisects(db, history.bisect_dir):
            raise StoreError("the bisect record was not indexed", where=str(path))
    if dry_run:
        log(f"aggregate: would push {path.name} to {data_branch}")
    else:
        history.publish(f"distci: bisect {record['axis']} {record['good']}..{record['bad']}",
                        redo=lambda: history.add_bisect(record))
    if issue:
        asked = record.get("asked", record)
        key = BisectPlan(asked["cell_id"], asked["test_id"], asked["axis"], asked["good"], asked["bad"]).key
        culprit = record.get("culprit")
        head = (f"Bisect of {record['axis']} {code(asked['good'])} .. {code(asked['bad'])} on "
                f"{code(record['cell_id'])}: **{record.get('status') or 'done'}**")
        body = "\n\n".join(filter(None, [
            head + (f", first bad {code(culprit)}" if culprit else ""),
            record.get("summary") and f"~~~text\n{record['summary']}\n~~~",
            record.get("report_path") and f"Report and logs: {record['report_path']}",
            marker("bisect-result", key),
        ]))
        issues = tracker(repo, api_url, dry_run, log)
        target = Issue(issue, "open", "", "", set())
        issues.load_comment_markers(target)
        if f"bisect-result={key}" not in target.markers:
            issues.comment(target, body)
    return path

