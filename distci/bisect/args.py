"""`distci bisect`'s command line, parsed once into BisectArgs.

`distci bisect MODE ...`: one subcommand per mode, each with only its options:

    versions       releases, nightlies or wheelhouse builds of a package (--source)
    commits        commits of a local clone (--repo), built into wheels
    below-nightly  torch nightlies, then the main commits between the two it ends on
    python-diff    two torch builds: the Python file, hunk and lines that flip the check
    compiler       inside torch.compile: the backend, subsystem, pass (torch's bisector)
    list           the store's regressions, to bisect with --from-regression

The old spelling (`distci bisect TEST_ID --good X --bad Y --python-diff ...`, modes chosen
by flags) keeps working for one release, with a deprecation line on stderr naming the new
one. Every library function of bisect takes typed values; only `parse_bisect` sees
argparse. `to_argv` writes the options back in the subcommand form (everything but
--fresh), so the rerun line printed by a bisect reproduces the whole command, and a
rerun of it asks the same question.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

from distci.errors import ConfigError

SOURCES = ("release", "nightly", "wheelhouse", "git")
DEFAULT_OUT = str(Path(".distci") / "bisect")
DEFAULT_CACHE = str(Path(".distci") / "bisect-cache")


@dataclass
class BisectArgs:
    """The options of `distci bisect` (see add_parser for what each means)."""

    test_id: str | None = None
    good: str | None = None
    bad: str | None = None
    axis: str | None = None
    source: str | None = None
    find_fix: bool = False
    command: str | None = None
    from_regression: str | None = None
    list_regressions: bool = False
    store: str | None = None
    cell: str | None = None
    stack: str | None = None
    repeats: int = 1
    confirm: bool = True
    timeout: float | None = None
    on_timeout: str = "skip"
    index_url: str | None = None
    variant: str = "cpu"
    wheelhouse: str | None = None
    find_links: list[str] = field(default_factory=list)
    no_index: bool = False
    repo: str | None = None
    limit: int | None = None
    base_env: str | None = None
    python: str = sys.executable
    builder: str | None = None
    build_env: list[str] = field(default_factory=list)
    cache: str = DEFAULT_CACHE
    out: str = DEFAULT_OUT
    state: str | None = None
    report: str | None = None
    markdown: str | None = None
    fresh: bool = False
    below_nightly: bool = False
    python_diff: bool = False
    check_requires: list[str] = field(default_factory=list)
    narrow: bool = True
    compiler: bool = False
    in_env: str | None = None
    compiler_backend: str | None = None

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> "BisectArgs":
        if hasattr(ns, "bisect_argv"):  # straight from `distci bisect ...`
            return parse_bisect(ns.bisect_argv)[0]
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})

    def build_env_pairs(self) -> dict[str, str]:
        pairs = {}
        for item in self.build_env:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"--build-env {item!r}: expected KEY=VALUE")
            pairs[key] = value
        return pairs

    @property
    def mode(self) -> str:
        """The subcommand this question is asked with."""
        if self.list_regressions:
            return "list"
        if self.compiler:
            return "compiler"
        if self.python_diff:
            return "python-diff"
        if self.below_nightly:
            return "below-nightly"
        if self.source == "git" or (self.repo and self.source is None):
            return "commits"
        return "versions"

    def to_argv(self) -> list[str]:
        """The command line asking the same question (without --fresh), subcommand first."""
        mode = self.mode
        known = mode_options(mode)
        out = [mode, *([self.test_id] if self.test_id else [])]
        defaults = BisectArgs()
        for f in fields(self):
            value, default = getattr(self, f.name), getattr(defaults, f.name)
            if f.name in ("test_id", "fresh") or f.name not in known or value == default or value is None:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag if value else f"--no-{f.name.replace('_', '-')}")
            elif isinstance(value, list):
                for item in value:
                    out += [flag, str(item)]
            else:
                out += [flag, str(value)]
        return out


MODES: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    "versions": ("bisect releases, nightlies or wheelhouse builds of a package",
                 ("question", "pins", "envs", "store", "index", "limit"), {}),
    "commits": ("bisect the commits of a local clone (pure-Python packages: torchao, torchtitan)",
                ("question", "pins", "envs", "store", "git", "limit"), {"source": "git"}),
    "below-nightly": ("bisect torch nightlies, then the main commits between the two adjacent ones",
                      ("question", "pins", "envs", "store", "index", "limit"), {"below_nightly": True}),
    "python-diff": ("between two torch builds: the Python file, hunk and lines that flip the check",
                    ("question", "envs", "index", "pydiff"), {"python_diff": True}),
    "compiler": ("inside torch.compile: the backend, subsystem and pass that break it",
                 ("question", "pins", "envs", "store", "index", "compiler"), {"compiler": True}),
    "list": ("list the store's regressions (bisect one with --from-regression)", ("store",),
             {"list_regressions": True}),
}
LEGACY_FLAGS = {"--below-nightly": "below-nightly", "--python-diff": "python-diff", "--compiler": "compiler",
                "--list-regressions": "list"}
Warn = Callable[[str], None]


def _question(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("test_id", nargs="?", help="the test to run through the harness (or give --command)")
    p.add_argument("--command", help="a check read like `git bisect run`: 0 good, 125 skip, 1-127 bad")
    p.add_argument("--good", help="good endpoint; leave out to search back from --bad")
    p.add_argument("--bad", help="bad endpoint; with --find-fix, leave out to search back from --good")
    p.add_argument("--axis", default=None, help="the package bisected (default: torch)")
    p.add_argument("--find-fix", action="store_true", help="find the first good after bad")
    p.add_argument("--repeats", type=int, default=1, help="probe each candidate R times; disagreement is flaky")
    p.add_argument("--confirm", action=argparse.BooleanOptionalAction, default=True,
                   help="re-probe the final good/bad pair once more (default on); disagreement is flaky")
    p.add_argument("--timeout", type=float, default=None, help="seconds per check")
    p.add_argument("--on-timeout", choices=("skip", "bad"), default="skip",
                   help="what a check past --timeout answers (default skip; bad: a hang is the bug)")
    p.add_argument("--python", default=sys.executable, help="interpreter of the probe venvs")
    p.add_argument("--cache", default=DEFAULT_CACHE, help="environments and built wheels")
    p.add_argument("--out", default=DEFAULT_OUT, help="states and reports (indexed by the store)")
    p.add_argument("--state", help="state file (default: derived from the question, under --out)")
    p.add_argument("--report", help="JSON report (default: next to the state file)")
    p.add_argument("--markdown", help="also write the report as Markdown here (for reports/)")
    p.add_argument("--fresh", action="store_true", help="ignore a saved state")


def _pins(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--from-regression", metavar="ID", help="bisect a regression of the store: "
                   "RUN_ID::TEST_ID, a test id (its newest regression) or a run id")
    p.add_argument("--stack", help="stack.json (or run directory) of the bad cell: every other package "
                   "is pinned to it")


def _envs(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--base-env", help="venv holding the rest of the stack (instead of pins)")
    p.add_argument("--find-links", action="append", default=[], metavar="DIR",
                   help="more wheels for pip (the pinned stack's), repeatable")
    p.add_argument("--no-index", action="store_true", help="pip uses only --find-links / --wheelhouse")


def _store(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--store", help="the store (default: DISTCI_STORE or .distci/store.sqlite)")
    p.add_argument("--cell", help="with --from-regression: which cell; else the cell whose newest run's "
                   "stack pins the other packages" + ("; compiler: the cell whose stack env fails"
                                                      if mode == "compiler" else ""))


def _index(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--source", choices=SOURCES if mode == "legacy" else tuple(s for s in SOURCES if s != "git"),
                   help="default: wheelhouse with --wheelhouse, nightly for dates, else release")
    p.add_argument("--index-url", help="index for release/nightly (default: DISTCI_INDEX_URL / "
                   "DISTCI_NIGHTLY_INDEX_URL; releases: pip's configuration when unset)")
    p.add_argument("--variant", default="cpu", help="replaces {variant} in the nightly index URL")
    p.add_argument("--wheelhouse", help="directory of wheels (source wheelhouse)")


def _limit(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--limit", type=int, default=None, help="without --good: at most N candidates back")


def _git(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--repo", help="local clone (source git)")
    p.add_argument("--builder", default=None, help="interpreter that builds commits (default: the "
                   "base env's, which has what setup.py imports)")
    p.add_argument("--build-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for commit builds, e.g. USE_CPP=0 for torchao")


def _pydiff(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--check-requires", action="append", default=[], metavar="REQ",
                   help="what the check imports besides torch (e.g. numpy), resolved with the bad "
                   "build's dependencies into the shared base; repeatable")
    p.add_argument("--narrow", action=argparse.BooleanOptionalAction, default=True,
                   help="cut each hunk found to the lines that matter (default on)")


def _compiler(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--in-env", help="the failing environment (a venv); default for a test id: the "
                   "stack env of --cell, else of the pr tier's cell")
    p.add_argument("--compiler-backend", help="start at this backend (e.g. inductor)")


def _legacy_modes(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument("--list-regressions", action="store_true", help="list the store's regressions and exit")
    p.add_argument("--below-nightly", action="store_true", help="torch nightly: when the bisect ends "
                   "on two adjacent nightlies, go on over the main commits between them")
    p.add_argument("--python-diff", action="store_true", help="torch: between two builds whose native "
                   "parts are interchangeable, bisect the differing Python files and hunks")
    p.add_argument("--compiler", action="store_true", help="run torch's compiler bisector on the failure")


GROUPS = {"question": _question, "pins": _pins, "envs": _envs, "store": _store, "index": _index,
          "limit": _limit, "git": _git, "pydiff": _pydiff, "compiler": _compiler, "legacy": _legacy_modes}
LEGACY_GROUPS = ("question", "pins", "envs", "store", "index", "limit", "git", "pydiff", "compiler", "legacy")


def mode_parser(mode: str, prog: str = "distci bisect",
                extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.ArgumentParser:
    """The parser of one mode (or "legacy": every option and the mode flags)."""
    if mode == "legacy":
        p = argparse.ArgumentParser(prog=prog, description="the old flag spelling (deprecated)")
        groups, defaults = LEGACY_GROUPS, {}
    else:
        description, groups, defaults = MODES[mode]
        p = argparse.ArgumentParser(prog=f"{prog} {mode}", description=description, allow_abbrev=False)
    for group in groups:
        GROUPS[group](p, mode)
    if extra is not None and "question" in groups:
        extra(p)
    p.set_defaults(**defaults)
    return p


def mode_options(mode: str) -> set[str]:
    """The BisectArgs fields a mode's parser sets."""
    return {a.dest for a in mode_parser(mode)._actions if a.dest != "help"}


def parse_bisect(argv: Sequence[str], *, warn: Warn | None = None,
                 extra: Callable[[argparse.ArgumentParser], None] | None = None) -> tuple[BisectArgs, argparse.Namespace]:
    """`distci bisect ...`'s arguments -> (BisectArgs, the namespace, for options that are
    not the question's such as --backend). The old flag spelling is parsed as before, with
    one deprecation line (through `warn`, default stderr) naming the new spelling."""
    argv = list(argv)
    if argv and argv[0] in MODES:
        ns = mode_parser(argv[0], extra=extra).parse_args(argv[1:])
        return BisectArgs.from_namespace(ns), ns
    ns = mode_parser("legacy", extra=extra).parse_args(argv)
    args = BisectArgs.from_namespace(ns)
    said = warn or (lambda line: print(line, file=sys.stderr))
    said(f"distci bisect: the flag spelling is deprecated and goes in the next release; write "
         f"`distci bisect {args.mode} ...` (modes: {', '.join(MODES)}), e.g. "
         f"distci bisect {' '.join(_quoted(args.to_argv()))}")
    return args, ns


def _quoted(argv: list[str]) -> list[str]:
    import shlex

    return [shlex.quote(a) for a in argv]


def add_parser(sub: Any, description: str, fn: Any) -> argparse.ArgumentParser:
    """Register `distci bisect MODE ...`: the mode and its options are parsed by
    parse_bisect (so the old flag spelling still parses), from what follows `bisect`."""
    p = sub.add_parser("bisect", help="bisect a regression (or a fix): " + ", ".join(MODES),
                       description=description + "\n\nmodes:\n" + "\n".join(
                           f"  {name:<14} {text}" for name, (text, _, _) in MODES.items())
                       + "\n\n`distci bisect MODE --help` lists a mode's options.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False,
                       usage="distci bisect MODE [options]   (distci bisect MODE --help)")

    # Everything after `bisect` is the mode's to parse (the old spelling starts with an
    # option argparse would reject here): hand it over verbatim.
    def verbatim(args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None):
        ns = namespace if namespace is not None else argparse.Namespace()
        ns.bisect_argv, ns.fn, ns.bisect_help = list(args or []), fn, p.format_help()
        return ns, []

    p.parse_known_args = verbatim  # type: ignore[method-assign]
    return p
