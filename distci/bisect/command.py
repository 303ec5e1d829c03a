"""`python -m distci bisect`: list candidates, build the probe, run the engine, report.

    distci bisect TEST_ID --good X --bad Y [--axis torch] [--source nightly] [--find-fix]
    distci bisect --from-regression RUN_ID::TEST_ID        (the store says the rest)
    distci bisect --command 'python check.py' --bad 2026-11-20 --source nightly
    distci bisect --command 'python repro.py' --good v0.9.0 --bad main --axis torchao --repo ../ao
    distci bisect TEST_ID --axis torch --source nightly --good D1 --bad D2 --below-nightly
    distci bisect --command 'python check.py' --good 2.14.0 --bad 2.14.1 --python-diff
    distci bisect TEST_ID --compiler                         (which compile pass breaks it)

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
import hashlib
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from distci.bisect.args import BisectArgs
from distci.bisect.args import add_parser as _add_parser
from distci.bisect.candidates import (
    SwappedEndpoints,
    WheelCandidate,
    git_candidates,
    nightly_candidates,
    release_candidates,
    wheelhouse_candidates,
)
from distci.bisect.checks import CommandCheck, PytestCheck
from distci.bisect.docker import add_options as add_backend_options
from distci.bisect.docker import run_in_image
from distci.bisect.engine import BisectRefused, BisectResult, bisect
from distci.bisect.install import Base, CommitBuilder, EnvCache, InstallFailed
from distci.bisect.pins import Pins, load_stack
from distci.bisect.probes import CommitProbe, WheelProbe
from distci.bisect.report import format_result, store_record, to_markdown, write_report
from distci.bisect.state import BisectError, BisectState
from distci.envs import env_python
from distci.errors import ConfigError, InfraError
from distci.wheelhouse import archived

SELFWHEELS = Path(".distci") / "selfwheels"
_NIGHTLY_LIKE = re.compile(r"^\d{4}-?\d{2}-?\d{2}$|\.dev\d{8}")
Log = Callable[[str], None]


def add_parser(sub: Any) -> None:
    p = _add_parser(sub, __doc__.split("\n\n")[0], run)
    add_backend_options(p)


@dataclass
class Question:
    """What is bisected, after --from-regression filled in what the store knows."""

    axis: str
    source: str
    first: str | None
    last: str | None
    test_id: str | None
    command: str | None
    pins: Pins | None = None
    fixes_mode: str | None = None
    cell_id: str = ""
    regression: str | None = None
    argv: list[str] = field(default_factory=list)


def run(ns: argparse.Namespace, *, log: Log = print) -> int:
    if getattr(ns, "backend", "host") == "docker":
        cell = ns.image_cell or ns.cell
        if not cell:
            raise ConfigError("--backend docker runs the bisect in a cell's image: give --image-cell or --cell")
        return run_in_image(cell, _raw_argv(), log=log)
    return main(BisectArgs.from_namespace(ns), log=log)


def main(args: BisectArgs, *, log: Log = print) -> int:
    if args.list_regressions:
        return _list_regressions(args, log)
    question = _question(args, log)
    if args.compiler:
        from distci.bisect.compiler_command import run_compiler

        return run_compiler(args, question, log)
    newest = "--good" if args.find_fix else "--bad"
    if question.last is None:
        raise BisectError(f"{newest} is required: it is the newest end, where the search starts")
    if args.python_diff:
        from distci.bisect.pydiff import run_python_diff

        return run_python_diff(args, question, log)
    candidates = _candidates(args, question)
    if question.test_id and question.pins is None and not args.base_env:
        log("note: no --stack, --cell or --base-env: nothing is pinned; each candidate gets its own "
            "dependencies from pip, and pytest and packaging come unpinned")
    cache = env_cache(args, question, log)
    check = make_check(args, question, cache, log)
    builder = _builder(args, question, cache)
    meta = question_meta(args, question, cache, check, builder)
    state_path = Path(args.state) if args.state else Path(args.out) / "runs" / _digest(
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
            repeats=args.repeats, confirm=args.confirm, state=BisectState.open(state_path, meta),
            on_event=lambda event: log(str(event)))
    except BisectRefused as refused:
        record = _report(args, question, cache, refused.result, meta, report_path, resume)
        log(f"report: {report_path}")
        if record.get("test_id") and (question.regression or args.store):
            _to_store(args, report_path, log)
        raise
    extra: dict[str, Any] = {}
    if args.below_nightly:
        from distci.bisect.below import below_nightly

        extra["below_nightly"] = below_nightly(result, question, cache, check, state_path.parent, log)
    record = _report(args, question, cache, result, meta, report_path, resume, extra)
    log(format_result(result))
    commits = record.get("commits")
    if commits:
        log(f"nightly builds: {commits['last_old']} .. {commits['first_new']}")
    log(f"report: {report_path}")
    if record.get("test_id") and (question.regression or args.store):
        _to_store(args, report_path, log)
    return 1 if result.kind == "flaky" else 0


def question_meta(args: BisectArgs, q: Question, cache: EnvCache, check: CommandCheck,
                  builder: CommitBuilder | None) -> dict[str, Any]:
    """Every input that changes a probe's answer: the state file is keyed on it."""
    return {"axis": q.axis, "source": q.source, "check": check.command,
            "check_files": _named_files(check.command), "repo": _resolved(args.repo),
            "base_env": _resolved(args.base_env), "pins": _digest(cache.base.requirements),
            "python": _resolved(args.python), "index": _index_url(args, q) if q.source in (
                "release", "nightly") else "", "wheelhouse": _resolved(args.wheelhouse),
            "builder": _resolved(builder.builder) if builder else "",
            "build_env": sorted(args.build_env), "timeout": args.timeout,
            "on_timeout": args.on_timeout, "fixes": q.fixes_mode or "none"}


def _report(args: BisectArgs, q: Question, cache: EnvCache, result: BisectResult[Any],
            meta: dict[str, Any], path: Path, resume: str,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the JSON report (with the store's keys for a test id); returns what was
    written at its top level: the store record and, for torch, the commit range."""
    from distci.bisect.below import torch_commits

    commits = torch_commits(q.axis, cache, result)
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


def _question(args: BisectArgs, log: Log) -> Question:
    test_id, command = args.test_id, args.command
    axis, good, bad, source = args.axis, args.good, args.bad, args.source
    pins: Pins | None = None
    fixes_mode = None
    cell_id = args.cell or ""
    regression = None
    if args.from_regression:
        if test_id or good or bad:
            raise BisectError("--from-regression takes the test and both endpoints from the store; "
                              "leave out TEST_ID, --good and --bad")
        from distci.bisect.regression import changed_axis, find_regression
        from distci.store import Store

        with Store(args.store) as store:
            found = find_regression(store, args.from_regression, args.cell)
        change = changed_axis(found.good_run.stack, found.bad_run.stack, prefer=axis)
        axis, good, bad = change.package, change.good, change.bad
        if source is None and change.source == "git":
            source = "git"
        test_id = found.result.test_id if not command else None
        cell_id, regression = found.result.cell_id, found.ident
        pins = Pins.from_stack(found.bad_run.stack, where=f"run {found.bad_run.run_id}")
        fixes_mode = found.bad_run.stack.get("fixes_mode")
        log(f"regression {found.ident} in {cell_id}: {axis} {change.good_version} (green, run "
            f"{found.good_run.run_id}) -> {change.bad_version} (red, run {found.bad_run.run_id})")
    elif args.stack:
        stack = load_stack(args.stack)
        pins, fixes_mode = Pins.from_stack(stack, where=args.stack), stack.get("fixes_mode")
    elif args.cell and not args.compiler:  # with --compiler the cell names the env (compiler_command.py)
        from distci.store import Store

        with Store(args.store) as store:
            runs = store.runs(cell_id=args.cell)
        if not runs:
            raise BisectError(f"no run of cell {args.cell} in the store: its stack gives the pins")
        pins = Pins.from_stack(runs[-1].stack, where=f"run {runs[-1].run_id}")
        fixes_mode = runs[-1].stack.get("fixes_mode")
    if bool(test_id) == bool(command):
        raise BisectError("give a TEST_ID or --command (not both)")
    axis = axis or "torch"
    first, last = (bad, good) if args.find_fix else (good, bad)
    source = source or _infer_source(args, good, bad)
    return Question(axis, source, first, last, test_id, command, pins, fixes_mode, cell_id,
                    regression, args.to_argv())


def _infer_source(args: BisectArgs, good: str | None, bad: str | None) -> str:
    if args.repo:
        return "git"
    if args.wheelhouse:
        return "wheelhouse"
    if any(_NIGHTLY_LIKE.search(v or "") for v in (good, bad)):
        return "nightly"
    return "release"


def _candidates(args: BisectArgs, q: Question) -> list:
    """The candidate list; swapped endpoints are called swapped, with the roles named."""
    try:
        return candidates_of(args, q)
    except SwappedEndpoints as swapped:
        older, newer = ("--bad", "--good") if args.find_fix else ("--good", "--bad")
        hint = ("without --find-fix to find where it broke" if args.find_fix
                else "with --find-fix to find where it was fixed")
        raise BisectError(f"the endpoints are swapped: {swapped}, but {older} must be the older "
                          f"end; swap --good and --bad, or rerun {hint}") from None


def candidates_of(args: BisectArgs, q: Question, *, first: str | None = None,
                  last: str | None = None) -> list:
    first, last = first or q.first, last or q.last
    assert last is not None
    if q.source == "git":
        if not args.repo:
            raise ConfigError("--source git needs --repo PATH (a local clone)")
        return git_candidates(args.repo, first=first, last=last, limit=args.limit)
    if q.source == "wheelhouse":
        if not args.wheelhouse:
            raise ConfigError("--source wheelhouse needs --wheelhouse DIR")
        return wheelhouse_candidates(args.wheelhouse, q.axis, first=first, last=last, limit=args.limit)
    url = _index_url(args, q)
    ca = os.environ.get("DISTCI_CA_BUNDLE", "")
    if q.source == "nightly":
        return nightly_candidates(url, q.axis, first=first, last=last, limit=args.limit,
                                  ca_bundle=ca, archive=archived(None, q.axis))
    return release_candidates(url, q.axis, first=first, last=last, limit=args.limit, ca_bundle=ca)


def _index_url(args: BisectArgs, q: Question) -> str:
    variable = "DISTCI_NIGHTLY_INDEX_URL" if q.source == "nightly" else "DISTCI_INDEX_URL"
    url = (args.index_url or os.environ.get(variable, "")).strip().replace("{variant}", args.variant)
    if not url:
        raise ConfigError(f"{variable} is not set: --source {q.source} needs the index URL (or --index-url)")
    return url


def env_cache(args: BisectArgs, q: Question, log: Log = print) -> EnvCache:
    """The probes' environments: the candidate alone, over a base holding the rest of the
    stack (--base-env as it is, or an env of the pins made by distci.envs)."""
    pip_args = [arg for d in args.find_links for arg in ("--find-links", str(Path(d).resolve()))]
    if q.source == "wheelhouse" and args.wheelhouse:
        pip_args += ["--find-links", str(Path(args.wheelhouse).resolve())]
    if args.no_index:
        pip_args.append("--no-index")
    if args.base_env:
        base = Base(env=Path(args.base_env))
    elif q.pins is not None:
        # a stack lists every installed distribution: install it as it is, no resolution
        base = Base(requirements=tuple(q.pins.harness_requirements(q.axis) if q.test_id
                                       else q.pins.requirements(q.axis)), install_args=("--no-deps",))
    elif q.test_id:
        base = Base(requirements=("pytest", "packaging"))
    else:
        base = Base()
    return EnvCache(Path(args.cache), python=args.python, base=base, pip_args=pip_args, log=log)


def _builder(args: BisectArgs, q: Question, cache: EnvCache) -> CommitBuilder | None:
    """How commits are built (git source only): by --builder, else by the interpreter of the
    env the commit is installed into (the base env: it has what setup.py imports)."""
    if q.source != "git":
        return None
    builder = args.builder
    if builder is None:
        try:
            base = cache.base_env()
        except InstallFailed as failed:
            raise BisectError(f"{failed}: {failed.log[-2000:]}") from None
        builder = str(env_python(base)) if base is not None else args.python
    return CommitBuilder(cache.root, builder, args.build_env_pairs())


def make_check(args: BisectArgs, q: Question, cache: EnvCache, log: Log) -> CommandCheck:
    on_timeout = "bad" if args.on_timeout == "bad" else "skip"
    if q.command:
        return CommandCheck(q.command, cwd=Path.cwd(), timeout=args.timeout, on_timeout=on_timeout)
    env = {"PYTHONPATH": str(harness_path(cache, log)), "DISTCI_FIXES": q.fixes_mode or "none"}
    return PytestCheck(harness_command(q.test_id or ""), cwd=Path.cwd(), timeout=args.timeout,
                       env=env, on_timeout=on_timeout)


def harness_command(test_id: str) -> str:
    """One test id through the harness in torchrun mode: nothing outlives the probe."""
    return shlex.join(["python", "-m", "pytest", "-p", "distci.harness", "-p", "no:cacheprovider",
                       "-q", "-x", "--distci-mode=torchrun", test_id])


def harness_path(cache: EnvCache, log: Log = print) -> Path:
    """A directory holding distci (and distci-fixes) for PYTHONPATH inside the candidate
    environments: this checkout's wheels, so probes run the harness of today."""
    from distci.selfwheels import build_all

    try:
        return cache.tools(build_all(SELFWHEELS, log=log))
    except (InfraError, InstallFailed) as exc:
        raise BisectError(f"cannot build distci's own wheels for the probes: {exc}") from None


# -- after the search -------------------------------------------------------------------


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
    from distci.ingest import read_bisect
    from distci.store import Store

    with Store(args.store) as store:
        store.add_bisects(read_bisect(report))
        where = store.path
    log(f"store: bisect recorded in {where}")


def _list_regressions(args: BisectArgs, log: Log) -> int:
    from distci.bisect.regression import list_regressions
    from distci.store import Store

    with Store(args.store) as store:
        rows = list_regressions(store, args.cell)
    for row in rows:
        log(f"{row.run_id}::{row.test_id}  ({row.cell_id}) {row.error_signature or row.verdict_reason}")
    if not rows:
        log("no regressions in the store")
    return 0


# -- helpers ----------------------------------------------------------------------------


def _named_files(command: str) -> dict[str, str]:
    """Digests of the files a check command names (its script): editing the check script
    changes the question."""
    try:
        words = shlex.split(command)
    except ValueError:
        return {}
    found = {}
    for word in words:
        path = Path(word)
        if len(word) < 256 and path.suffix and path.is_file():
            found[word] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return found


def _resolved(path: str | None) -> str:
    """Absolute, links kept: a venv's python is a link to the base interpreter, and two
    venvs must not read as one."""
    return os.path.abspath(path) if path else ""


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


def _digest(parts: Any) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]
