"""`python -m distci bisect`: list candidates, build the probe, run the engine, report.

    distci bisect TEST_ID --good X --bad Y [--axis torch] [--source nightly] [--find-fix]
    distci bisect --command 'python check.py' --bad 2026-11-20 --source nightly
    distci bisect --command 'python repro.py' --good v0.9.0 --bad main --axis torchao --repo ../ao

The state file is derived from the question (axis, source, test or command, environment),
so running the same command again resumes an interrupted bisect; `--fresh` starts over.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

from distci.bisect.candidates import (
    git_candidates,
    nightly_candidates,
    release_candidates,
    wheelhouse_candidates,
)
from distci.bisect.engine import BisectResult, bisect
from distci.bisect.probes import CommandCheck, CommitProbe, EnvCache, WheelProbe
from distci.bisect.report import format_result, write_report
from distci.bisect.state import BisectError, BisectState
from distci.errors import ConfigError

SOURCES = ("release", "nightly", "wheelhouse", "git")
# pytest: 2 interrupted, 3 internal error, 4 usage error, 5 nothing collected (the test
# does not exist at this candidate): none of them is an answer about the candidate.
PYTEST_EXIT_MAP = {2: "skip", 3: "skip", 4: "skip", 5: "skip"}
_NIGHTLY_LIKE = re.compile(r"^\d{4}-?\d{2}-?\d{2}$|\.dev\d{8}")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bisect", help="bisect a regression (or a fix) to a version, nightly or commit",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("test_id", nargs="?", help="the test to run through the harness (or give --command)")
    p.add_argument("--good", help="good endpoint; leave out to search back from --bad")
    p.add_argument("--bad", help="bad endpoint; with --find-fix, leave out to search back from --good")
    p.add_argument("--axis", default="torch", help="the package bisected (default: torch)")
    p.add_argument("--source", choices=SOURCES, help="default: git with --repo, wheelhouse with "
                   "--wheelhouse, nightly for dates, else release")
    p.add_argument("--find-fix", action="store_true", help="find the first good after bad")
    p.add_argument("--command", help="a check read like `git bisect run`: 0 good, 125 skip, 1-127 bad")
    p.add_argument("--repeats", type=int, default=1, help="probe each candidate R times; disagreement is flaky")
    p.add_argument("--timeout", type=float, default=None, help="seconds per check; a timeout is bad")
    p.add_argument("--index-url", help="index for release/nightly (default: DISTCI_INDEX_URL / "
                   "DISTCI_NIGHTLY_INDEX_URL)")
    p.add_argument("--variant", default="cpu", help="replaces {variant} in the nightly index URL")
    p.add_argument("--wheelhouse", help="directory of wheels (source wheelhouse)")
    p.add_argument("--repo", help="local clone (source git)")
    p.add_argument("--limit", type=int, default=None, help="without --good: at most N candidates back")
    p.add_argument("--base-env", help="venv holding the rest of the stack (e.g. the bad cell's env)")
    p.add_argument("--python", default=sys.executable, help="interpreter of the probe venvs")
    p.add_argument("--builder", default=sys.executable, help="interpreter that builds commits (git)")
    p.add_argument("--build-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for commit builds, e.g. USE_CPP=0 for torchao")
    p.add_argument("--cache", default=".distci/bisect", help="environments, states, reports")
    p.add_argument("--state", help="state file (default: derived from the question, under --cache)")
    p.add_argument("--report", help="JSON report (default: next to the state file)")
    p.add_argument("--fresh", action="store_true", help="ignore a saved state")
    p.set_defaults(fn=run)


def run(args: argparse.Namespace, *, log: Callable[[str], None] = print) -> int:
    newest = "--good" if args.find_fix else "--bad"
    if (args.good if args.find_fix else args.bad) is None:
        raise BisectError(f"{newest} is required: it is the newest end, where the search starts")
    if bool(args.test_id) == bool(args.command):
        raise BisectError("give a TEST_ID or --command (not both)")
    source = args.source or _infer_source(args)
    first, last = (args.bad, args.good) if args.find_fix else (args.good, args.bad)
    candidates = _candidates(args, source, first, last)
    cache = Path(args.cache)
    check = _check(args)
    meta = {"axis": args.axis, "source": source, "check": check.command,
            "base_env": args.base_env or "",
            "python": "" if args.python == sys.executable else args.python}
    slug = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:12]
    state_path = Path(args.state) if args.state else cache / "runs" / slug / "state.json"
    if args.fresh:
        state_path.unlink(missing_ok=True)
    report_path = Path(args.report) if args.report else state_path.with_name("report.json")
    resume = shlex.join(["nox", "-s", "bisect", "--", *_argv(args), "--state", str(state_path)])
    log(f"bisect {args.axis} ({source}): {len(candidates)} candidates, "
        f"{candidates[0].label} .. {candidates[-1].label}")
    log(f"state: {state_path} (interrupted? rerun: {resume})")

    envs = EnvCache(cache / "envs", python=args.python, base_env=args.base_env)
    probe = (CommitProbe(check, envs, builder=args.builder, build_env=_pairs(args.build_env))
             if source == "git" else WheelProbe(check, envs))
    result: BisectResult[Any] = bisect(
        candidates, probe, find_fix=args.find_fix, lone_end=first is None, repeats=args.repeats,
        state=BisectState.open(state_path, meta), on_event=lambda event: log(str(event)))
    write_report(report_path, result, meta=meta, resume=resume)
    log(format_result(result))
    log(f"report: {report_path}")
    return 1 if result.kind == "flaky" else 0


def _infer_source(args: argparse.Namespace) -> str:
    if args.repo:
        return "git"
    if args.wheelhouse:
        return "wheelhouse"
    if any(_NIGHTLY_LIKE.search(v or "") for v in (args.good, args.bad)):
        return "nightly"
    return "release"


def _candidates(args: argparse.Namespace, source: str, first: str | None, last: str) -> list:
    if source == "git":
        if not args.repo:
            raise ConfigError("--source git needs --repo PATH (a local clone)")
        return git_candidates(args.repo, first=first, last=last, limit=args.limit)
    if source == "wheelhouse":
        if not args.wheelhouse:
            raise ConfigError("--source wheelhouse needs --wheelhouse DIR")
        return wheelhouse_candidates(args.wheelhouse, args.axis, first=first, last=last, limit=args.limit)
    variable = "DISTCI_NIGHTLY_INDEX_URL" if source == "nightly" else "DISTCI_INDEX_URL"
    url = (args.index_url or os.environ.get(variable, "")).strip().replace("{variant}", args.variant)
    if not url:
        raise ConfigError(f"{variable} is not set: --source {source} needs the index URL (or --index-url)")
    ca = os.environ.get("DISTCI_CA_BUNDLE", "")
    if source == "nightly":
        return nightly_candidates(url, args.axis, first=first, last=last, limit=args.limit, ca_bundle=ca)
    return release_candidates(url, args.axis, first=first, last=last, limit=args.limit, ca_bundle=ca)


def _check(args: argparse.Namespace) -> CommandCheck:
    if args.command:
        return CommandCheck(args.command, cwd=Path.cwd(), timeout=args.timeout)
    command = shlex.join(["python", "-m", "pytest", "-p", "distci.harness", "-p", "no:cacheprovider",
                          "-q", "-x", args.test_id])
    return CommandCheck(command, cwd=Path.cwd(), timeout=args.timeout, exit_map=PYTEST_EXIT_MAP)


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
    defaults = {"axis": "torch", "repeats": 1, "variant": "cpu", "cache": ".distci/bisect"}
    for name in ("good", "bad", "axis", "source", "command", "repeats", "timeout", "index_url",
                 "variant", "wheelhouse", "repo", "limit", "base_env", "cache"):
        value = getattr(args, name)
        if value is not None and value != "" and value != defaults.get(name):
            out += [f"--{name.replace('_', '-')}", str(value)]
    if args.find_fix:
        out.append("--find-fix")
    for item in args.build_env:
        out += ["--build-env", item]
    return out
