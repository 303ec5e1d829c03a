"""`python -m distci bisect MODE`: list candidates, build the probe, run the engine, report.

    distci bisect versions TEST_ID --good X --bad Y [--axis torch] [--source nightly] [--find-fix]
    distci bisect versions --from-regression RUN_ID::TEST_ID   (the store says the rest)
    distci bisect versions --command 'python check.py' --bad 2026-11-20 --source nightly
    distci bisect commits --command 'python repro.py' --good v0.9.0 --bad main --axis torchao --repo ../ao
    distci bisect below-nightly TEST_ID --good D1 --bad D2
    distci bisect python-diff --command 'python check.py' --good 2.14.0 --bad 2.14.1
    distci bisect compiler TEST_ID                            (which compile pass breaks it)
    distci bisect list                                        (the store's regressions)

A TEST_ID runs through the harness in torchrun mode inside each candidate's environment
(every other package pinned to the bad cell's stack: --stack, --cell, or the regression's
red run), with distci's own wheels from this checkout on PYTHONPATH.

The state file is derived from every input that changes an answer (axis, source, repo,
check and the files it names, builder, build env, pins, python, timeout), so running the
same command again resumes an interrupted bisect, and changing any of them starts a new
one; `--fresh` starts over. States and reports go under --out (.distci/bisect, which the
store indexes: a test-id bisect lands on the dashboard); environments under --cache.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from distci.bisect.args import BisectArgs
from distci.bisect.args import add_parser as _add_parser
from distci.bisect.args import parse_bisect
from distci.bisect.candidates import CommitCandidate
from distci.bisect.checks import PytestCheck
from distci.bisect.docker import add_options as add_backend_options
from distci.bisect.docker import run_in_image
from distci.bisect.engine import BisectRefused, BisectResult, bisect
from distci.bisect.install import EnvCache
from distci.bisect.probes import CommitProbe, WheelProbe
from distci.bisect.report import format_result, store_record, to_markdown, write_report
from distci.bisect.state import BisectError, BisectState
from distci.bisect.question import Question, commit_builder, question_candidates, args_digest, build_question, env_cache, make_check, question_meta
from distci.bisect.question import Log


EXIT_CODES = {"boundary": 0, "flaky": 1, "unconfirmed": 1, "refused": 2, "range": 3, "came-and-went": 4}
"""How `distci bisect` ends (docs/bisect.md): 0 only for one confirmed culprit; 2 is also
every error (distci.cli); a range and a history that came and went have their own codes."""


def add_parser(sub: Any) -> None:
    _add_parser(sub, __doc__.split("\n\n")[0], run)


def run(ns: argparse.Namespace, *, log: Log = print) -> int:
    argv = list(getattr(ns, "bisect_argv", []))
    if not argv or argv[0] in ("-h", "--help"):
        print(getattr(ns, "bisect_help", ""))
        return 0 if argv else 2
    args, options = parse_bisect(argv, extra=add_backend_options)
    if getattr(options, "backend", "host") == "docker":
        return run_in_image(options.image_cell or options.cell, _raw_argv(), log=log)
    return main(args, log=log)


def main(args: BisectArgs, *, log: Log = print) -> int:
    """Run the question's mode (MODE_RUNNERS); its exit code (EXIT_CODES)."""
    if args.mode == "list":
        return _list_regressions(args, log)
    question = build_question(args, log)
    if args.mode != "compiler" and question.last is None:
        newest = "--good" if args.find_fix else "--bad"
        raise BisectError(f"{newest} is required: it is the newest end, where the search starts")
    return MODE_RUNNERS[args.mode](args, question, log)


def _run_compiler(args: BisectArgs, question: Question, log: Log) -> int:
    from distci.bisect.compiler_command import run_compiler

    return run_compiler(args, question, log)


def _run_python_diff(args: BisectArgs, question: Question, log: Log) -> int:
    from distci.bisect.pydiff_command import run_python_diff

    return run_python_diff(args, question, log)


def _run_search(args: BisectArgs, question: Question, log: Log) -> int:
    """The engine's modes: versions, commits, below-nightly (the engine, then the stage below)."""
    candidates = question_candidates(args, question)
    if question.test_id and question.pins is None and not args.base_env:
        log("note: no --stack, --cell or --base-env: nothing is pinned; each candidate gets its own "
            "dependencies from pip, and pytest and packaging come unpinned")
    cache = env_cache(args, question, log)
    check = make_check(args, question, cache, log)
    builder = commit_builder(args, question, cache)
    meta = question_meta(args, question, cache, check, builder)
    state_path = Path(args.state) if args.state else Path(args.out) / "runs" / args_digest(
        [json.dumps(meta, sort_keys=True)]) / "state.json"
    if args.fresh:
        state_path.unlink(missing_ok=True)
    # one state per question (a wider range reuses its probes), one report per range
    ends = re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{question.first or ''}..{question.last}")[:80]
    report_path = Path(args.report) if args.report else state_path.with_name(
        f"report{'-fix' if args.find_fix else ''}-{ends}.json")
    if isinstance(check, PytestCheck):
        check.run_dir = state_path.with_name("harness")
        # the `=` form: pytest reads unknown option values as paths when it picks its
        # rootdir, which would then change the test ids
        check.command += " " + shlex.quote(f"--distci-run-dir={check.run_dir}")
    resume = shlex.join(["nox", "-s", "bisect", "--", *question.argv])
    log(f"bisect {question.axis} ({question.source}): {len(candidates)} candidates, "
        f"{candidates[0].label} .. {candidates[-1].label}")
    log(f"state: {state_path} (interrupted? rerun: {resume})")

    probe = (CommitProbe(check, cache, builder) if builder is not None else WheelProbe(check, cache))
    try:
        result: BisectResult[Any] = bisect(
            candidates, probe, find_fix=args.find_fix, lone_end=question.first is None,
            repeats=args.repeats, confirm=args.confirm, flanks=args.flanks,
            state=BisectState.open(state_path, meta), on_event=lambda event: log(str(event)))
    except BisectRefused as refused:
        record = _report(args, question, cache, refused.result, meta, report_path, resume)
        log(f"report: {report_path}")
        if record.get("test_id") and (question.regression or args.store):
            _to_store(args, report_path, log)
        raise
    extra: dict[str, Any] = {}
    if args.mode == "below-nightly":
        from distci.bisect.below import below_nightly

        extra["below_nightly"] = below_nightly(result, question, cache, check, state_path.parent, log,
                                               repeats=args.repeats, confirm=args.confirm, flanks=args.flanks)
    record = _report(args, question, cache, result, meta, report_path, resume, extra)
    log(format_result(result))
    commits = record.get("commits")
    if commits and commits.get("subject") is not None:  # commits of a clone
        log(f"{'first bad' if result.mode == 'regression' else 'first good'} commit: "
            f"{commits['first_new'][:12]} {commits['subject']}")
        log(f"compare: {commits['compare']}")
    elif commits:
        log(f"nightly builds: {commits['last_old']} .. {commits['first_new']}")
        log(f"compare: {commits['compare']}")
    log(f"report: {report_path}")
    if record.get("test_id") and (question.regression or args.store):
        _to_store(args, report_path, log)
    return exit_code(result.kind, (extra.get("below_nightly") or {}), result.reason)


def exit_code(kind: str, below: dict[str, Any], reason: str) -> int:
    """The exit code of a search (EXIT_CODES); below the nightly, its stage's answer
    decides when it bisected (a stage that only listed or could not run leaves the
    nightly boundary as the answer). Non-zero ends say why on stderr."""
    if kind == "boundary" and below.get("status") in EXIT_CODES and below["status"] != "refused":
        kind, reason = below["status"], below.get("reason", "")
    code = EXIT_CODES.get(kind, 1)
    if code:
        said = {1: "no answer named (flaky)", 3: "a range, not a culprit",
                4: "came and went: no culprit named (the one-flip assumption does not hold)"}[code]
        print(f"distci: bisect: {said}" + (f": {reason}" if reason else ""), file=sys.stderr)
    return code


MODE_RUNNERS = {"versions": _run_search, "commits": _run_search, "below-nightly": _run_search,
                "python-diff": _run_python_diff, "compiler": _run_compiler}
"""mode -> what runs it (`list` needs no question: main answers it first)."""


def _report(args: BisectArgs, q: Question, cache: EnvCache, result: BisectResult[Any],
            meta: dict[str, Any], path: Path, resume: str,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the JSON report (with the store's keys for a test id); returns what was
    written at its top level: the store record and, for torch, the commit range."""
    from distci.bisect.below import torch_commits

    commits = torch_commits(q.axis, cache, result) or clone_commits(result)
    extra = dict(extra or {}, **({"commits": commits} if commits else {}))
    record = store_record(result, test_id=q.test_id, axis=f"{q.axis}-{q.source}",
                          cell_id=q.cell_id, report_path=_shown(path),
                          culprit=_culprit(result, extra),
                          created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    write_report(path, result, meta=dict(meta, regression=q.regression), resume=resume,
                 record=record, extra=extra)
    if args.markdown:
        data = json.loads(path.read_text())
        command = shlex.join(["nox", "-s", "bisect", "--", *q.argv])
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(to_markdown(data, command=command))
    return {**(record or {}), **extra}


# -- the question ------------------------------------------------------------------------


# -- after the search -------------------------------------------------------------------


def clone_commits(result: BisectResult[Any]) -> dict[str, str] | None:
    """The two commits of a clone around a boundary, the culprit's subject and where to
    compare them (the commits mode's answer, read like the nightly modes')."""
    if result.kind != "boundary" or not isinstance(result.first_new, CommitCandidate):
        return None
    from distci.bisect.upstream import clone_compare  # GitHub's client: a controller dependency

    old, new = result.last_old.commit, result.first_new.commit
    return {"last_old": old, "first_new": new, "subject": result.first_new.subject,
            "compare": clone_compare(result.first_new.repo, old, new)}


def _culprit(result: BisectResult[Any], extra: dict[str, Any]) -> str | None:
    if result.kind != "boundary":
        return None
    below = extra.get("below_nightly") or {}
    if below.get("culprit"):
        return str(below["culprit"])[:12]
    commit = getattr(result.first_new, "commit", None)
    if commit:
        return commit[:12]
    commits = extra.get("commits")
    if commits:
        return f"pytorch/pytorch@{commits['last_old'][:12]}...{commits['first_new'][:12]}"
    return None


def _to_store(args: BisectArgs, report: Path, log: Log) -> None:
    from distci.judge.ingest import read_bisect
    from distci.judge.store import Store

    with Store(args.store) as store:
        store.add_bisects(read_bisect(report))
        where = store.path
    log(f"store: bisect recorded in {where}")


def _list_regressions(args: BisectArgs, log: Log) -> int:
    from distci.bisect.regression import list_regressions
    from distci.judge.store import Store

    with Store(args.store) as store:
        rows = list_regressions(store, args.cell)
    for row in rows:
        log(f"{row.run_id}::{row.test_id}  ({row.cell_id}) {row.error_signature or row.verdict_reason}")
    if not rows:
        log("no regressions in the store")
    return 0


# -- helpers ----------------------------------------------------------------------------


def _raw_argv() -> list[str]:
    """This process's bisect arguments as given (the container reruns them)."""
    argv = sys.argv[1:]
    return argv[argv.index("bisect") + 1:] if "bisect" in argv else argv


def _shown(path: Path) -> str:
    """A path as the dashboard shows it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


