"""`distci bisect`'s command line, parsed once into BisectArgs.

Every library function of bisect takes typed values; only `from_namespace` sees argparse.
`to_argv` writes the options back (everything but --fresh), so the resume line printed by
a bisect reproduces the whole command, and a rerun of it asks the same question.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

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
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})

    def build_env_pairs(self) -> dict[str, str]:
        pairs = {}
        for item in self.build_env:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"--build-env {item!r}: expected KEY=VALUE")
            pairs[key] = value
        return pairs

    def to_argv(self) -> list[str]:
        """The command line asking the same question (without --fresh)."""
        out = [self.test_id] if self.test_id else []
        defaults = BisectArgs()
        for f in fields(self):
            value, default = getattr(self, f.name), getattr(defaults, f.name)
            if f.name in ("test_id", "fresh") or value == default or value is None:
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


def add_parser(sub: Any, description: str, fn: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("bisect", help="bisect a regression (or a fix) to a version, nightly or commit",
                       description=description)
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
    p.add_argument("--confirm", action=argparse.BooleanOptionalAction, default=True,
                   help="re-probe the final good/bad pair once more (default on); disagreement is flaky")
    p.add_argument("--timeout", type=float, default=None, help="seconds per check")
    p.add_argument("--on-timeout", choices=("skip", "bad"), default="skip",
                   help="what a check past --timeout answers (default skip; bad: a hang is the bug)")
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
    p.add_argument("--builder", default=None, help="interpreter that builds commits (default: the "
                   "base env's, which has what setup.py imports)")
    p.add_argument("--build-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for commit builds, e.g. USE_CPP=0 for torchao")
    p.add_argument("--cache", default=DEFAULT_CACHE, help="environments and built wheels")
    p.add_argument("--out", default=DEFAULT_OUT, help="states and reports (indexed by the store)")
    p.add_argument("--state", help="state file (default: derived from the question, under --out)")
    p.add_argument("--report", help="JSON report (default: next to the state file)")
    p.add_argument("--markdown", help="also write the report as Markdown here (for reports/)")
    p.add_argument("--fresh", action="store_true", help="ignore a saved state")
    p.add_argument("--below-nightly", action="store_true", help="torch nightly: when the bisect ends "
                   "on two adjacent nightlies, go on over the main commits between them")
    p.add_argument("--python-diff", action="store_true", help="torch: between two builds whose native "
                   "parts are interchangeable, bisect the differing Python files and hunks")
    p.add_argument("--check-requires", action="append", default=[], metavar="REQ",
                   help="with --python-diff: what the check imports besides torch (e.g. numpy), "
                   "resolved with the bad build's dependencies into the shared base; repeatable")
    p.add_argument("--narrow", action=argparse.BooleanOptionalAction, default=True,
                   help="with --python-diff: cut each hunk found to the lines that matter (default on)")
    p.add_argument("--compiler", action="store_true", help="run torch's compiler bisector on the "
                   "failure (in the --bad candidate's environment, else --in-env, else here)")
    p.add_argument("--in-env", help="with --compiler: the failing environment (a venv); default for a test "
                   "id: the stack env of --cell, else of the pr tier's cell")
    p.add_argument("--compiler-backend", help="with --compiler: start at this backend (e.g. inductor)")
    p.set_defaults(fn=fn)
    return p
