"""What every bisect mode shares: the question (what to search, between which endpoints,
with which check), its candidates, the env cache the probes install into, and the key a
run's saved state is filed under. The modes import this; it imports no mode.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from distci.bisect.args import BisectArgs
from distci.bisect.candidates import (
    SwappedEndpoints,
    git_candidates,
    nightly_candidates,
    release_candidates,
    wheelhouse_candidates,
)
from distci.bisect.checks import CommandCheck, PytestCheck
from distci.bisect.install import Base, CommitBuilder, EnvCache, InstallFailed
from distci.bisect.pins import Pins, load_stack
from distci.bisect.state import BisectError
from distci.errors import ConfigError, InfraError
from distci.provision.envs import env_python
from distci.provision.pipconfig import pip_index_urls
from distci.provision.wheelhouse import archived
from distci.run.cellrun import QUIET_PLUGINS

SELFWHEELS = Path(".distci") / "selfwheels"


_NIGHTLY_LIKE = re.compile(r"^\d{4}-?\d{2}-?\d{2}$|\.dev\d{8}")


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


def question_meta(args: BisectArgs, q: Question, cache: EnvCache, check: CommandCheck,
                  builder: CommitBuilder | None) -> dict[str, Any]:
    """Every input that changes a probe's answer: the state file is keyed on it."""
    return {"axis": q.axis, "source": q.source, "check": check.command,
            "check_files": _named_files(check.command), "repo": _resolved(args.repo),
            "base_env": _resolved(args.base_env), "pins": args_digest(cache.base.requirements),
            "python": _resolved(args.python), "index": _index_key(args, q) if q.source in (
                "release", "nightly") else "", "wheelhouse": _resolved(args.wheelhouse),
            "builder": _resolved(builder.builder) if builder else "",
            "build_env": sorted(args.build_env), "timeout": args.timeout,
            "on_timeout": args.on_timeout, "fixes": q.fixes_mode or "none"}


def build_question(args: BisectArgs, log: Log) -> Question:
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
        from distci.judge.store import Store

        with Store(args.store) as store:
            found = find_regression(store, args.from_regression, args.cell)
        change = changed_axis(found.good_run.stack, found.bad_run.stack, prefer=axis)
        axis, good, bad = change.package, change.good, change.bad
        if source is None and change.source == "git":
            source = "git"
        test_id = found.result.test_id if not command else None
        cell_id, regression = found.result.cell_id, found.ident
        pins = Pins.from_stack(found.bad_run.stack, where=f"run {found.bad_run.run_id}")
        fixes_mode = found.bad_run.stack.fixes_mode
        log(f"regression {found.ident} in {cell_id}: {axis} {change.good_version} (green, run "
            f"{found.good_run.run_id}) -> {change.bad_version} (red, run {found.bad_run.run_id})")
    elif args.stack:
        stack = load_stack(args.stack)
        pins, fixes_mode = Pins.from_stack(stack, where=args.stack), stack.fixes_mode
    elif args.cell and args.mode != "compiler":  # with --compiler the cell names the env (compiler_command.py)
        from distci.judge.store import Store

        with Store(args.store) as store:
            runs = store.runs(cell_id=args.cell)
        if not runs:
            raise BisectError(f"no run of cell {args.cell} in the store: its stack gives the pins")
        pins = Pins.from_stack(runs[-1].stack, where=f"run {runs[-1].run_id}")
        fixes_mode = runs[-1].stack.fixes_mode
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


def question_candidates(args: BisectArgs, q: Question) -> list:
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
    ca = os.environ.get("DISTCI_CA_BUNDLE", "")
    if q.source == "release" and not index_url(args, q, required=False):
        return pip_release_candidates(args, q, first, last, ca)
    url = index_url(args, q)
    if q.source == "nightly":
        return nightly_candidates(url, q.axis, first=first, last=last, limit=args.limit,
                                  ca_bundle=ca, archive=archived(None, q.axis))
    return release_candidates(url, q.axis, first=first, last=last, limit=args.limit, ca_bundle=ca)


def pip_release_candidates(args: BisectArgs, q: Question, first: str | None, last: str,
                           ca: str) -> list:
    """Releases on the indexes of pip's configuration, merged (a version on any of them is
    a candidate); pip installs each with its configuration as it is."""
    from distci.bisect.candidates import merge_release_candidates

    urls = pip_index_urls(args.python)
    return merge_release_candidates(urls, q.axis, first=first, last=last, limit=args.limit, ca_bundle=ca)


def index_url(args: BisectArgs, q: Question, *, required: bool = True) -> str:
    """The index a release / nightly source is listed from: --index-url, else
    DISTCI_INDEX_URL / DISTCI_NIGHTLY_INDEX_URL; for releases, "" when neither is set and
    pip's configuration is to serve (pip then downloads with it as it is)."""
    variable = "DISTCI_NIGHTLY_INDEX_URL" if q.source == "nightly" else "DISTCI_INDEX_URL"
    url = (args.index_url or os.environ.get(variable, "")).strip().replace("{variant}", args.variant)
    if not url and q.source == "release" and not required:
        return ""
    if not url:
        raise ConfigError(f"{variable} is not set: --source {q.source} needs the index URL (or --index-url)")
    return url


def index_setting(args: BisectArgs, q: Question) -> str:
    """Where the index comes from, as a user reads it."""
    if args.index_url:
        return f"--index-url {args.index_url}"
    variable = "DISTCI_NIGHTLY_INDEX_URL" if q.source == "nightly" else "DISTCI_INDEX_URL"
    return f"{variable}={os.environ[variable]}" if os.environ.get(variable) else ""


def _index_key(args: BisectArgs, q: Question) -> str:
    """The index part of the state's key: the URL, or pip's configuration (digested)."""
    url = index_url(args, q, required=False) if q.source == "release" else index_url(args, q)
    if url:
        return url
    from distci.provision.pipconfig import resolution_environment

    return "pip:" + args_digest([json.dumps(resolution_environment(args.python), sort_keys=True)])


def env_cache(args: BisectArgs, q: Question, log: Log = print) -> EnvCache:
    """The probes' environments: the candidate alone, over a base holding the rest of the
    stack (--base-env as it is, or an env of the pins made by distci.provision.envs)."""
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


def commit_builder(args: BisectArgs, q: Question, cache: EnvCache) -> CommitBuilder | None:
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
    """One test id through the harness in torchrun mode: nothing outlives the probe. The probe's
    session leaves out the plugins a cell's session does (QUIET_PLUGINS: hypothesis's, in a base
    env that has it, was about a CPU-second of every probe)."""
    return shlex.join(["python", "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS,
                       "-q", "-x", "--distci-mode=torchrun", test_id])


def harness_path(cache: EnvCache, log: Log = print) -> Path:
    """A directory holding distci (and distci-fixes) for PYTHONPATH inside the candidate
    environments: this checkout's wheels, so probes run the harness of today."""
    from distci.provision.selfwheels import build_all

    try:
        return cache.tools(build_all(SELFWHEELS, log=log))
    except (InfraError, InstallFailed) as exc:
        raise BisectError(f"cannot build distci's own wheels for the probes: {exc}") from None


def args_digest(parts: Any) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


Log = Callable[[str], None]


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
