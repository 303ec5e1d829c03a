"""`distci bisect`'s command line, parsed once into BisectArgs.

`distci bisect MODE ...`: one subcommand per mode, each with only its options:

    versions       releases, nightlies or wheelhouse builds of a package (--source)
    commits        commits of a local clone (--repo), built into wheels
    below-nightly  torch nightlies, then the main commits between the two it ends on
    python-diff    two torch builds: the Python file, hunk and lines that flip the check
    compiler       inside torch.compile: the backend, subsystem, pass (torch's bisector)
    list           the store's regressions, to bisect with --from-regression

Every option is declared once, as a BisectArgs field whose metadata (`option(...)`) holds
its help, its group and how it is spelled, as nox's `_options.py` declares its options:
one loop (`_add_option`) builds each mode's parser from the fields of the mode's groups,
and `to_argv` writes the same fields back (everything but --fresh), so the rerun line a
bisect prints reproduces the whole command and asks the same question. The mode itself
is a field, set by the subcommand; distci.bisect.command dispatches on it by a table.

The old spelling (`distci bisect TEST_ID --good X --bad Y --python-diff ...`, modes chosen
by flags) keeps working for one release, with a deprecation line on stderr naming the new
one. Every library function of bisect takes typed values; only `parse_bisect` sees
argparse.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

from distci.bisect.engine import CONFIRM_RUNS, FLANKS
from distci.errors import ConfigError

SOURCES = ("release", "nightly", "wheelhouse", "git")
DEFAULT_OUT = str(Path(".distci") / "bisect")
DEFAULT_CACHE = str(Path(".distci") / "bisect-cache")

# how an option is spelled (the `kind` of option()):
VALUE, FLAG, SWITCH, MANY, RUNS, POSITIONAL = "value", "flag", "switch", "many", "runs", "positional"


def option(default: Any = None, *, help: str, group: str, kind: str = VALUE, type: Callable[[str], Any] = str,
           metavar: str | None = None, choices: Sequence[str] | None = None, rerun: bool = True,
           mode_help: dict[str, str] | None = None) -> Any:
    """A BisectArgs field that is an option of the modes whose groups include `group`.

    kind: VALUE `--name X`; FLAG `--name`; SWITCH `--name / --no-name`; MANY `--name X`,
    repeatable (a list); RUNS `--name [N] / --no-name` (a count, 0 when off); POSITIONAL.
    `rerun=False`: left out of the rerun line (`--fresh`). `mode_help`: more help in a mode.
    """
    meta = {"help": help, "group": group, "kind": kind, "type": type, "metavar": metavar,
            "choices": choices, "rerun": rerun, "mode_help": mode_help or {}}
    if kind == MANY:
        return field(default_factory=list, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class BisectArgs:
    """The options of `distci bisect`, each declared once (see option())."""

    mode: str = ""
    """The subcommand; "" until known: commits for a git source, else versions."""
    # -- the question: what is bisected, between which ends, with which check
    test_id: str | None = option(help="the test to run through the harness (or give --command)",
                                 group="question", kind=POSITIONAL)
    command: str | None = option(help="a check read like `git bisect run`: 0 good, 125 skip, 1-127 bad",
                                 group="question")
    good: str | None = option(help="good endpoint; leave out to search back from --bad", group="question")
    bad: str | None = option(help="bad endpoint; with --find-fix, leave out to search back from --good",
                             group="question")
    axis: str | None = option(help="the package bisected (default: torch)", group="question")
    find_fix: bool = option(False, help="find the first good after bad", group="question", kind=FLAG)
    repeats: int = option(1, help="probe each candidate R times; disagreement is flaky", group="question",
                          type=int)
    confirm: int = option(CONFIRM_RUNS, kind=RUNS, type=int, group="question",
                          help=f"fresh runs of each side of the answer before it is named (default "
                               f"{CONFIRM_RUNS}, chosen by distci.bisect.simulate); disagreement is flaky")
    flanks: int = option(FLANKS, type=int, group="question",
                         help=f"candidates probed on each side of the answer for a second flip (default {FLANKS})")
    timeout: float | None = option(help="seconds per check", group="question", type=float)
    on_timeout: str = option("skip", choices=("skip", "bad"), group="question",
                             help="what a check past --timeout answers (default skip; bad: a hang is the bug)")
    python: str = option(sys.executable, help="interpreter of the probe venvs", group="question")
    cache: str = option(DEFAULT_CACHE, help="environments and built wheels", group="question")
    out: str = option(DEFAULT_OUT, help="states and reports (indexed by the store)", group="question")
    state: str | None = option(help="state file (default: derived from the question, under --out)",
                               group="question")
    report: str | None = option(help="JSON report (default: next to the state file)", group="question")
    markdown: str | None = option(help="also write the report as Markdown here (for reports/)", group="question")
    fresh: bool = option(False, help="ignore a saved state", group="question", kind=FLAG, rerun=False)
    # -- the rest of the stack, pinned
    from_regression: str | None = option(metavar="ID", group="pins", help=(
        "bisect a regression of the store: RUN_ID::TEST_ID, a test id (its newest regression) or a run id"))
    stack: str | None = option(group="pins", help="stack.json (or run directory) of the bad cell: every "
                               "other package is pinned to it")
    # -- the probes' environments
    base_env: str | None = option(help="venv holding the rest of the stack (instead of pins)", group="envs")
    find_links: list[str] = option(kind=MANY, metavar="DIR", group="envs",
                                   help="more wheels for pip (the pinned stack's), repeatable")
    no_index: bool = option(False, kind=FLAG, group="envs", help="pip uses only --find-links / --wheelhouse")
    # -- the store
    store: str | None = option(help="the store (default: DISTCI_STORE or .distci/store.sqlite)", group="store")
    cell: str | None = option(group="store", help="with --from-regression: which cell; else the cell whose "
                              "newest run's stack pins the other packages",
                              mode_help={"compiler": "; compiler: the cell whose stack env fails (default: the pr "
                                                     "tier's cell, as `distci run`)"})
    # -- where release / nightly / wheelhouse candidates come from
    source: str | None = option(group="index", choices=tuple(s for s in SOURCES if s != "git"),
                                help="default: wheelhouse with --wheelhouse, nightly for dates, else release")
    index_url: str | None = option(group="index", help="index for release/nightly (default: DISTCI_INDEX_URL / "
                                   "DISTCI_NIGHTLY_INDEX_URL; releases: pip's configuration when unset)")
    variant: str = option("cpu", help="replaces {variant} in the nightly index URL", group="index")
    wheelhouse: str | None = option(help="directory of wheels (source wheelhouse)", group="index")
    limit: int | None = option(type=int, group="limit", help="without --good: at most N candidates back")
    # -- commits of a clone
    repo: str | None = option(help="local clone (source git)", group="git")
    builder: str | None = option(group="git", help="interpreter that builds commits (default: the base "
                                 "env's, which has what setup.py imports)")
    build_env: list[str] = option(kind=MANY, metavar="KEY=VALUE", group="git",
                                  help="environment for commit builds, e.g. USE_CPP=0 for torchao")
    # -- python-diff
    check_requires: list[str] = option(kind=MANY, metavar="REQ", group="pydiff", help=(
        "what the check imports besides torch (e.g. numpy), resolved with the bad build's dependencies "
        "into the shared base; repeatable"))
    narrow: bool = option(True, kind=SWITCH, group="pydiff",
                          help="cut each hunk found to the lines that matter (default on)")
    # -- compiler
    in_env: str | None = option(group="compiler", help="the failing environment (a venv); default for a "
                                "test id: the stack env of --cell, else of the pr tier's cell")
    compiler_backend: str | None = option(help="start at this backend (e.g. inductor)", group="compiler")

    def __post_init__(self) -> None:
        if not self.mode:
            self.mode = "commits" if self.source == "git" or (self.repo and self.source is None) else "versions"
        if self.mode not in MODES:
            raise ConfigError(f"bisect mode {self.mode!r}: expected one of {', '.join(MODES)}")

    def build_env_pairs(self) -> dict[str, str]:
        pairs = {}
        for item in self.build_env:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"--build-env {item!r}: expected KEY=VALUE")
            pairs[key] = value
        return pairs

    def to_argv(self) -> list[str]:
        """The command line asking the same question (without --fresh), subcommand first."""
        out = [self.mode]
        for f in options_of(self.mode):
            value, kind = getattr(self, f.name), f.metadata["kind"]
            if not f.metadata["rerun"] or value is None or value == _default(f):
                continue
            flag = "--" + f.name.replace("_", "-")
            if kind == POSITIONAL:
                out.insert(1, str(value))
            elif kind in (FLAG, SWITCH):
                out.append(flag if value else f"--no-{flag[2:]}")
            elif kind == RUNS:
                out += [flag, str(value)] if value else [f"--no-{flag[2:]}"]
            elif kind == MANY:
                out += [word for item in value for word in (flag, str(item))]
            else:
                out += [flag, str(value)]
        return out


MODES: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    "versions": ("bisect releases, nightlies or wheelhouse builds of a package",
                 ("question", "pins", "envs", "store", "index", "limit"), {}),
    "commits": ("bisect the commits of a local clone (pure-Python packages: torchao, torchtitan)",
                ("question", "pins", "envs", "store", "git", "limit"), {"source": "git"}),
    "below-nightly": ("bisect torch nightlies, then the main commits between the two adjacent ones",
                      ("question", "pins", "envs", "store", "index", "limit"), {}),
    "python-diff": ("between two torch builds: the Python file, hunk and lines that flip the check",
                    ("question", "envs", "index", "pydiff"), {}),
    "compiler": ("inside torch.compile: the backend, subsystem and pass that break it",
                 ("question", "pins", "envs", "store", "index", "compiler"), {}),
    "list": ("list the store's regressions (bisect one with --from-regression)", ("store",), {}),
}
"""mode -> (what it does, the option groups it takes, the defaults it sets)."""
LEGACY_FLAGS = {"--list-regressions": "list", "--below-nightly": "below-nightly", "--python-diff": "python-diff",
                "--compiler": "compiler"}
"""The old spelling's mode flags (checked in this order) -> the mode."""
LEGACY_SOURCES = SOURCES  # the old spelling took --source git
Warn = Callable[[str], None]


def options_of(mode: str) -> list[Field]:
    """The BisectArgs fields that are options of `mode` ("legacy": every option)."""
    groups = MODES[mode][1] if mode in MODES else None
    return [f for f in fields(BisectArgs) if "group" in f.metadata
            and (groups is None or f.metadata["group"] in groups)]


def _default(f: Field) -> Any:
    return f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]


def _add_option(p: argparse.ArgumentParser, f: Field, mode: str) -> None:
    """The one place an option becomes argparse: from its field's metadata."""
    meta, flag = f.metadata, "--" + f.name.replace("_", "-")
    help_text = meta["help"] + meta["mode_help"].get(mode, "")
    kind, default = meta["kind"], _default(f)
    if kind == POSITIONAL:
        p.add_argument(f.name, nargs="?", help=help_text)
    elif kind == FLAG:
        p.add_argument(flag, action="store_true", help=help_text)
    elif kind == SWITCH:
        p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
    elif kind == MANY:
        p.add_argument(flag, action="append", default=[], metavar=meta["metavar"], help=help_text)
    elif kind == RUNS:
        p.add_argument(flag, type=meta["type"], nargs="?", const=default, default=default, metavar="N",
                       help=help_text)
        p.add_argument(f"--no-{flag[2:]}", dest=f.name, action="store_const", const=0, help=f"{flag} 0")
    else:
        choices = LEGACY_SOURCES if mode == "legacy" and f.name == "source" else meta["choices"]
        p.add_argument(flag, type=meta["type"], default=default, choices=choices, metavar=meta["metavar"],
                       help=help_text)


def mode_parser(mode: str, prog: str = "distci bisect",
                extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.ArgumentParser:
    """The parser of one mode (or "legacy": every option and the mode flags)."""
    if mode == "legacy":
        p = argparse.ArgumentParser(prog=prog, description="the old flag spelling (deprecated)")
        for flag, name in LEGACY_FLAGS.items():
            p.add_argument(flag, action="store_true", help=f"the `{name}` mode")
    else:
        p = argparse.ArgumentParser(prog=f"{prog} {mode}", description=MODES[mode][0], allow_abbrev=False)
    for f in options_of(mode):
        _add_option(p, f, mode)
    if extra is not None and (mode == "legacy" or "question" in MODES[mode][1]):
        extra(p)
    p.set_defaults(**(MODES[mode][2] if mode in MODES else {}))
    return p


def _from_namespace(ns: argparse.Namespace, mode: str) -> BisectArgs:
    defaults = MODES[mode][2] if mode in MODES else {}
    return BisectArgs(mode=mode, **defaults, **{f.name: getattr(ns, f.name) for f in options_of(mode)
                                                if f.name not in defaults})


def parse_bisect(argv: Sequence[str], *, warn: Warn | None = None,
                 extra: Callable[[argparse.ArgumentParser], None] | None = None) -> tuple[BisectArgs, argparse.Namespace]:
    """`distci bisect ...`'s arguments -> (BisectArgs, the namespace, for options that are
    not the question's such as --backend). The old flag spelling is parsed as before, with
    one deprecation line (through `warn`, default stderr) naming the new spelling."""
    argv = list(argv)
    if argv and argv[0] in MODES:
        ns = mode_parser(argv[0], extra=extra).parse_args(argv[1:])
        return _from_namespace(ns, argv[0]), ns
    ns = mode_parser("legacy", extra=extra).parse_args(argv)
    mode = next((name for flag, name in LEGACY_FLAGS.items() if getattr(ns, flag[2:].replace("-", "_"))), "")
    args = _from_namespace(ns, mode)
    said = warn or (lambda line: print(line, file=sys.stderr))
    said(f"distci bisect: the flag spelling is deprecated and goes in the next release; write "
         f"`distci bisect {args.mode} ...` (modes: {', '.join(MODES)}), e.g. "
         f"distci bisect {shlex.join(args.to_argv())}")
    return args, ns


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
