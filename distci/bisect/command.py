"""`python -m distci bisect`: list candidates, build the probe, run the engine, report.

    distci bisect TEST_ID --good X --bad Y [--axis torch] [--source nightly] [--find-fix]
    distci bisect --from-regression RUN_ID::TEST_ID        (the store says the rest)
    distci bisect --command 'python check.py' --bad 2026-11-20 --source nightly
    distci bisect --command 'python repro.py' --good v0.9.0 --bad main --axis torchao --repo ../ao
    distci bisect --compiler --command 'python repro.py'   (which compile pass breaks it)

A TEST_ID runs through the harness in torchrun mode inside each candidate's environment
(every other package pinned to the bad cell's stack: --stack, --cell, or the regression's
red run), with distci's own wheels from this checkout on PYTHONPATH.

The state file is derived from the question (axis, source, test or command, pins,
environment), so running the same command again resumes an interrupted bisect; `--fresh`
starts over. States and reports go under --out (.distci/bisect, which the store indexes:
a test-id bisect lands on the dashboard); environments under --cache.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from distci.bisect.candidates import (
    WheelCandidate,
    git_candidates,
    nightly_candidates,
    release_candidates,
    wheelhouse_candidates,
)
from distci.bisect.compiler import compiler_bisect
from distci.bisect.docker import add_options as add_backend_options
from distci.bisect.docker import run_in_image
from distci.bisect.engine import BisectRefused, BisectResult, bisect
from distci.bisect.pins import Pins, load_stack
from distci.bisect.probes import (
    CommandCheck,
    CommitProbe,
    EnvCache,
    InstallFailed,
    PytestCheck,
    WheelProbe,
)
from distci.bisect.report import format_result, store_record, to_markdown, write_report
from distci.bisect.state import BisectError, BisectState
from distci.envs import env_python
from distci.errors import ConfigError, InfraError

SOURCES = ("release", "nightly", "wheelhouse", "git")
DEFAULT_OUT = Path(".distci") / "bisect"
DEFAULT_CACHE = Path(".distci") / "bisect-cache"
SELFWHEELS = Path(".distci") / "selfwheels"
_NIGHTLY_LIKE = re.compile(r"^\d{4}-?\d{2}-?\d{2}$|\.dev\d{8}")
COMPARE_URL = "https://github.com/pytorch/pytorch/compare/{good}...{bad}"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bisect", help="bisect a regression (or a fix) to a version, nightly or commit",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("test_id", nargs="?", help="the test to run through the harness (or give --command)")
    p.add_argument("--good", help="good endpoint; leave out to search back from --bad")
    p.add_argument("--bad", help="bad endpoint; with --find-fix, leave out to search back from --good")
    p.add_argument("--axis", default=None, help="the package bisected (default: torch)")
    p.add_argument("--source", choices=SOURCES, help="default: git with --repo, wheelhouse with "
                   "--wheelhouse, nightly for dates, else release")
    p.add_argument("--find-fix", action="store_true", help="find the first good after bad")
    p.add_argument("--command", help="a check read like `git bisect run`: 0 good, 125 skip, 1-127 bad")
    p.add_argument("--from-regression", metavar="ID", help="bisect a regression of the store: "
                   "RUN_ID::TEST_ID, a test id (its newest regression) or a run id")
    p.add_argument("--list-regressions", action="store_true", help="list the store's regressions and exit")
    p.add_argument("--store", help="the store (default: DISTCI_STORE or .distci/store.sqlite)")
    p.add_argument("--cell", help="with --from-regression: which cell; else the cell whose newest run's "
                   "stack pins the other packages")
    p.add_argument("--stack", help="stack.json (or run directory) of the bad cell: every other package "
                   "is pinned to it")
    p.add_argument("--repeats", type=int, default=1, help="probe each candidate R times; disagreement is flaky")
    p.add_argument("--timeout", type=float, default=None, help="seconds per check; a timeout is bad")
    p.add_argument("--index-url", help="index for release/nightly (default: DISTCI_INDEX_URL / "
                   "DISTCI_NIGHTLY_INDEX_URL)")
    p.add_argument("--variant", default="cpu", help="replaces {variant} in the nightly index URL")
    p.add_argument("--wheelhouse", help="directory of wheels (source wheelhouse)")
    p.add_argument("--find-links", action="append", default=[], metavar="DIR",
                   help="more wheels for pip (the pinned stack's), repeatable")
    p.add_argument("--no-index", action="store_true", help="pip uses only --find-links / --wheelhouse")
    p.add_argument("--repo", help="local clone (source git)")
    p.add_argument("--limit", type=int, default=None, help="without --good: at most N candidates back")
    p.add_argument("--base-env", help="venv holding the rest of the stack (instead of pins)")
    p.add_argument("--python", default=sys.executable, help="interpreter of the probe venvs")
    p.add_argument("--builder", default=sys.executable, help="interpreter that builds commits (git)")
    p.add_argument("--build-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for commit builds, e.g. USE_CPP=0 for torchao")
    p.add_argument("--cache", default=str(DEFAULT_CACHE), help="environments and built wheels")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="states and reports (indexed by the store)")
    p.add_argument("--state", help="state file (default: derived from the question, under --out)")
    p.add_argument("--report", help="JSON report (default: next to the state file)")
    p.add_argument("--markdown", help="also write the report as Markdown here (for reports/)")
    p.add_argument("--fresh", action="store_true", help="ignore a saved state")
    p.add_argument("--compiler", action="store_true", help="run torch's compiler bisector on the "
                   "failure (in the --bad candidate's environment, else --in-env, else here)")
    p.add_argument("--in-env", help="with --compiler: the failing environment (a venv)")
    p.add_argument("--compiler-backend", help="with --compiler: start at this backend (e.g. inductor)")
    add_backend_options(p)
    p.set_defaults(fn=run)


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


def run(args: argparse.Namespace, *, log: Callable[[str], None] = print) -> int:
    if args.backend == "docker":
        cell = args.image_cell or args.cell
        if not cell:
            raise ConfigError("--backend docker runs the bisect in a cell's image: give --image-cell or --cell")
        return run_in_image(cell, _raw_argv(), log=log)
    if args.list_regressions:
        return _list_regressions(args, log)
    question = _question(args, log)
    if args.compiler:
        return _run_compiler(args, question, log)
    newest = "--good" if args.find_fix else "--bad"
    if question.last is None:
        raise BisectError(f"{newest} is required: it is the newest end, where the search starts")
    candidates = _candidates(args, question)
    if question.test_id and question.pins is None and not args.base_env:
        log("note: no --stack, --cell or --base-env: nothing is pinned; each candidate gets its own "
            "dependencies from pip, and pytest and packaging come unpinned")
    out = Path(args.out)
    cache = _env_cache(args, question)
    check = _check(args, question, cache, log)
    meta = {"axis": question.axis, "source": question.source, "check": check.command,
            "base_env": args.base_env or "", "pins": _digest(cache.base_requirements),
            "python": "" if args.python == sys.executable else args.python}
    slug = _digest([json.dumps(meta, sort_keys=True)])
    state_path = Path(args.state) if args.state else out / "runs" / slug / "state.json"
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
    resume = shlex.join(["nox", "-s", "bisect", "--", *question.argv, "--state", str(state_path)])
    log(f"bisect {question.axis} ({question.source}): {len(candidates)} candidates, "
        f"{candidates[0].label} .. {candidates[-1].label}")
    log(f"state: {state_path} (interrupted? rerun: {resume})")

    probe = (CommitProbe(check, cache, builder=args.builder, build_env=_pairs(args.build_env))
             if question.source == "git" else WheelProbe(check, cache))
    try:
        result: BisectResult[Any] = bisect(
            candidates, probe, find_fix=args.find_fix, lone_end=question.first is None,
            repeats=args.repeats, state=BisectState.open(state_path, meta),
            on_event=lambda event: log(str(event)))
    except BisectRefused as refused:
        record = _report(args, question, cache, refused.result, meta, report_path, resume)
        log(f"report: {report_path}")
        if record.get("test_id") and (question.regression or args.store):
            _to_store(args, report_path, log)
        raise
    record = _report(args, question, cache, result, meta, report_path, resume)
    log(format_result(result))
    commits = record.get("commits")
    if commits:
        log(f"commit range: {commits['last_old']} .. {commits['first_new']}")
        log(f"  {commits['compare']}")
    log(f"report: {report_path}")
    if record.get("test_id") and (question.regression or args.store):
        _to_store(args, report_path, log)
    return 1 if result.kind == "flaky" else 0


def _report(args: argparse.Namespace, q: Question, cache: EnvCache, result: BisectResult[Any],
            meta: dict[str, Any], path: Path, resume: str) -> dict[str, Any]:
    """Write the JSON report (with the store's keys for a test id); returns what was
    written at its top level: the store record and, for torch, the commit range."""
    commits = _torch_commits(q, cache, result)
    record = store_record(result, test_id=q.test_id, axis=f"{q.axis}-{q.source}",
                          cell_id=q.cell_id, report_path=_shown(path),
                          culprit=_culprit(result, commits),
                          created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    extra = {"commits": commits} if commits else {}
    write_report(path, result, meta=dict(meta, regression=q.regression), resume=resume,
                 record=record, extra=extra)
    if args.markdown:
        data = json.loads(path.read_text())
        command = shlex.join(["nox", "-s", "bisect", "--", *q.argv])
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(to_markdown(data, command=command))
    return {**(record or {}), **extra}


# -- the question ------------------------------------------------------------------------


def _question(args: argparse.Namespace, log: Callable[[str], None]) -> Question:
    argv = _argv(args)
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
    elif args.cell:
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
    args.axis, args.good, args.bad = axis, good, bad
    source = source or _infer_source(args)
    return Question(axis, source, first, last, test_id, command, pins, fixes_mode, cell_id,
                    regression, argv)


def _infer_source(args: argparse.Namespace) -> str:
    if args.repo:
        return "git"
    if args.wheelhouse:
        return "wheelhouse"
    if any(_NIGHTLY_LIKE.search(v or "") for v in (args.good, args.bad)):
        return "nightly"
    return "release"


def _candidates(args: argparse.Namespace, q: Question) -> list:
    if q.source == "git":
        if not args.repo:
            raise ConfigError("--source git needs --repo PATH (a local clone)")
        return git_candidates(args.repo, first=q.first, last=q.last, limit=args.limit)
    if q.source == "wheelhouse":
        if not args.wheelhouse:
            raise ConfigError("--source wheelhouse needs --wheelhouse DIR")
        return wheelhouse_candidates(args.wheelhouse, q.axis, first=q.first, last=q.last, limit=args.limit)
    variable = "DISTCI_NIGHTLY_INDEX_URL" if q.source == "nightly" else "DISTCI_INDEX_URL"
    url = (args.index_url or os.environ.get(variable, "")).strip().replace("{variant}", args.variant)
    if not url:
        raise ConfigError(f"{variable} is not set: --source {q.source} needs the index URL (or --index-url)")
    ca = os.environ.get("DISTCI_CA_BUNDLE", "")
    if q.source == "nightly":
        return nightly_candidates(url, q.axis, first=q.first, last=q.last, limit=args.limit, ca_bundle=ca)
    return release_candidates(url, q.axis, first=q.first, last=q.last, limit=args.limit, ca_bundle=ca)


def _env_cache(args: argparse.Namespace, q: Question) -> EnvCache:
    """The probes' environments: the candidate alone, over a base holding the rest of the
    stack (--base-env as it is, or a venv built from the pins)."""
    pip_args = [arg for d in args.find_links for arg in ("--find-links", str(Path(d).resolve()))]
    if q.source == "wheelhouse" and args.wheelhouse:
        pip_args += ["--find-links", str(Path(args.wheelhouse).resolve())]
    if args.no_index:
        pip_args.append("--no-index")
    if args.base_env:
        return EnvCache(Path(args.cache), python=args.python, base_env=args.base_env, pip_args=pip_args)
    requirements: list[str] = []
    if q.pins is not None:
        requirements = (q.pins.harness_requirements(q.axis) if q.test_id
                        else q.pins.requirements(q.axis))
    elif q.test_id:
        requirements = ["pytest", "packaging"]
    # a stack lists every installed distribution: install it as it is, no resolution
    base_args = ["--no-deps"] if q.pins is not None else []
    return EnvCache(Path(args.cache), python=args.python, base_requirements=requirements,
                    pip_args=pip_args, base_args=base_args)


def _check(args: argparse.Namespace, q: Question, cache: EnvCache,
           log: Callable[[str], None]) -> CommandCheck:
    if q.command:
        return CommandCheck(q.command, cwd=Path.cwd(), timeout=args.timeout)
    command = harness_command(q.test_id or "")
    env = {"PYTHONPATH": str(harness_path(cache, log))}
    env["DISTCI_FIXES"] = q.fixes_mode or "none"
    return PytestCheck(command, cwd=Path.cwd(), timeout=args.timeout, env=env)


def harness_command(test_id: str) -> str:
    """One test id through the harness in torchrun mode: nothing outlives the probe."""
    return shlex.join(["python", "-m", "pytest", "-p", "distci.harness", "-p", "no:cacheprovider",
                       "-q", "-x", "--distci-mode=torchrun", test_id])


def harness_path(cache: EnvCache, log: Callable[[str], None] = print) -> Path:
    """A directory holding distci (and distci-fixes) for PYTHONPATH inside the candidate
    environments: this checkout's wheels, so probes run the harness of today."""
    from distci.selfwheels import build_all

    try:
        wheels = build_all(SELFWHEELS, log=log)
    except InfraError as exc:
        raise BisectError(f"cannot build distci's own wheels for the probes: {exc}") from None
    return cache.tools(wheels)


# -- after the search -------------------------------------------------------------------


def _torch_commits(q: Question, cache: EnvCache, result: BisectResult[Any]) -> dict[str, str] | None:
    """torch.version.git_version of the two candidates around a torch boundary (their
    environments exist: both were probed) and the GitHub compare URL between them."""
    if q.axis != "torch" or result.kind != "boundary" or not isinstance(result.first_new, WheelCandidate):
        return None
    shas = {}
    for name, candidate in (("last_old", result.last_old), ("first_new", result.first_new)):
        venv = cache.existing(candidate.key)
        if venv is None:
            return None
        proc = subprocess.run([str(env_python(venv)), "-c", "import torch; print(torch.version.git_version)"],
                              capture_output=True, text=True)
        if proc.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}", proc.stdout.strip()):
            return None
        shas[name] = proc.stdout.strip()
    good, bad = (shas["last_old"], shas["first_new"]) if result.mode == "regression" else (
        shas["first_new"], shas["last_old"])
    older, newer = shas["last_old"], shas["first_new"]
    return {**shas, "good": good, "bad": bad, "compare": COMPARE_URL.format(good=older, bad=newer)}


def _culprit(result: BisectResult[Any], commits: dict[str, str] | None) -> str | None:
    if result.kind != "boundary":
        return None
    commit = getattr(result.first_new, "commit", None)
    if commit:
        return commit[:12]
    if commits:
        return f"pytorch/pytorch@{commits['last_old'][:12]}...{commits['first_new'][:12]}"
    return None


def _to_store(args: argparse.Namespace, report: Path, log: Callable[[str], None]) -> None:
    from distci.ingest import read_bisect
    from distci.store import Store

    with Store(args.store) as store:
        store.add_bisects(read_bisect(report))
        where = store.path
    log(f"store: bisect recorded in {where}")


def _list_regressions(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    from distci.bisect.regression import list_regressions
    from distci.store import Store

    with Store(args.store) as store:
        rows = list_regressions(store, args.cell)
    for row in rows:
        log(f"{row.run_id}::{row.test_id}  ({row.cell_id}) {row.error_signature or row.verdict_reason}")
    if not rows:
        log("no regressions in the store")
    return 0


# -- compiler ---------------------------------------------------------------------------


def _run_compiler(args: argparse.Namespace, q: Question, log: Callable[[str], None]) -> int:
    """torch's compiler bisector in the failing environment: the bad candidate's (built
    like a probe's), else --in-env, else this interpreter's."""
    env: dict[str, str] = {}
    cache = None
    if args.bad is not None or q.pins is not None:
        cache = _env_cache(args, q)
    if args.bad is not None and q.source != "git":
        bad = _candidates(args, replace(q, first=None, last=args.bad))[-1]
        log(f"compiler bisect in the environment of {bad.label}")
        try:
            venv, _ = cache.ensure(bad.key, lambda: [*bad.pip_args(), bad.requirement])  # type: ignore[union-attr]
        except InstallFailed as failed:
            raise BisectError(f"the failing environment cannot be built: {failed}") from None
        python = str(env_python(venv))
    elif args.in_env:
        python = str(env_python(Path(args.in_env)))
    else:
        python = sys.executable
    tools = harness_path(cache or EnvCache(Path(args.cache)), log)
    env["PYTHONPATH"] = str(tools)
    if q.test_id:
        command = harness_command(q.test_id)
        env["DISTCI_FIXES"] = q.fixes_mode or "none"
    else:
        command = q.command or ""
    finding = compiler_bisect(command, python=python, cwd=Path.cwd(), env=env,
                              start_backend=args.compiler_backend, timeout=args.timeout, log=log)
    log(f"compiler bisector ({finding.runs} runs, {finding.seconds:.0f}s, torch {finding.torch}): "
        f"{finding.describe()}")
    report = Path(args.report) if args.report else Path(args.out) / "compiler" / (
        _digest([command, python]) + ".json")
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps({"kind": "compiler", "command": command, "test": q.test_id,
                                  "regression": q.regression, **finding.to_dict()}, indent=1) + "\n")
    log(f"report: {report}")
    return 0 if finding.backend else 1


# -- helpers ----------------------------------------------------------------------------


def _pairs(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--build-env {item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


def _argv(args: argparse.Namespace) -> list[str]:
    """The command line that asks the same question (for the resume hint)."""
    out = [args.test_id] if args.test_id else []
    defaults = {"repeats": 1, "variant": "cpu", "cache": str(DEFAULT_CACHE), "out": str(DEFAULT_OUT)}
    for name in ("from_regression", "store", "cell", "stack", "good", "bad", "axis", "source", "command",
                 "repeats", "timeout", "index_url", "variant", "wheelhouse", "repo", "limit", "base_env",
                 "cache", "out"):
        value = getattr(args, name)
        if value is not None and value != "" and value != defaults.get(name):
            out += [f"--{name.replace('_', '-')}", str(value)]
    for flag in ("find_fix", "no_index"):
        if getattr(args, flag):
            out.append(f"--{flag.replace('_', '-')}")
    for name in ("find_links", "build_env"):
        for item in getattr(args, name):
            out += [f"--{name.replace('_', '-')}", item]
    return out


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


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]
