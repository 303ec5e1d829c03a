"""Start a bisect from a regression in the store.

A `regression` verdict names the run where the test went red and, as `compared_run`,
the run it was green in before. Their Stacks say what changed between them; the
bisect question follows: the test id, the package whose version changed (torch first,
then torchao, torchtitan, torch_npu, then any other package), its version in the green
run as the good end and in the red run as the bad end, every other package pinned to
the red run's stack.

A regression is named `RUN_ID::TEST_ID` (what `distci bisect --list-regressions`
prints), or by its test id alone (the newest regression of that test; `--cell` picks
among cells), or by its run id alone when that run has one regression.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from distci.bisect.state import BisectError
from distci.provision.sources import PACKAGE_AXES
from distci.judge.store import Store
from distci.judge.rows import Regression, ResultRow
from distci.stack import Stack

AXES = PACKAGE_AXES
_GIT_LOCAL = re.compile(r"(?:^|[.+])g?(?:it)?([0-9a-f]{7,40})$")


@dataclass(frozen=True)
class AxisChange:
    """The package to bisect and its two endpoints, in the form the candidate lists take:
    dates for nightlies, commits for git builds, public versions for releases."""

    package: str
    source: str
    good: str
    bad: str
    good_version: str
    bad_version: str


def list_regressions(store: Store, cell: str | None = None) -> list[ResultRow]:
    """Every result whose verdict is `regression`, newest first."""
    return list(reversed(store.results(cell_id=cell, verdicts=["regression"])))


def find_regression(store: Store, ident: str, cell: str | None = None) -> Regression:
    """The regression `ident` names (see the module docstring)."""
    run_id, sep, test_id = ident.partition("::")
    if sep and store.run(run_id) is not None:
        row = store.result(run_id, test_id)
        if row is None:
            raise BisectError(f"run {run_id} has no result for {test_id}")
        return _regression(store, row)
    if store.run(ident) is not None:
        rows = [r for r in store.results(run_id=ident, verdicts=["regression"])]
        if len(rows) != 1:
            names = ", ".join(f"{ident}::{r.test_id}" for r in rows) or "none"
            raise BisectError(f"run {ident} has {len(rows)} regressions ({names}); name one as "
                              "RUN_ID::TEST_ID")
        return _regression(store, rows[0])
    rows = [r for r in list_regressions(store, cell) if r.test_id == ident]
    if not rows:
        raise BisectError(f"no regression of {ident!r} in the store"
                          + (f" for cell {cell}" if cell else "")
                          + "; `distci bisect --list-regressions` lists them")
    cells = sorted({r.cell_id for r in rows})
    if len(cells) > 1:
        raise BisectError(f"{ident} regressed in {len(cells)} cells ({', '.join(cells)}): "
                          "pick one with --cell")
    return _regression(store, rows[0])


def _regression(store: Store, row: ResultRow) -> Regression:
    if row.verdict != "regression":
        raise BisectError(f"{row.run_id}::{row.test_id} has verdict {row.verdict!r}, not "
                          "'regression': nothing to bisect")
    if not row.compared_run:
        raise BisectError(f"{row.run_id}::{row.test_id} names no green run to compare with")
    bad, good = store.run(row.run_id), store.run(row.compared_run)
    if bad is None or good is None:
        raise BisectError(f"run {row.compared_run if good is None else row.run_id} is not in "
                          "the store; ingest it first")
    return Regression(row, bad, good)


def changed_axis(good: Stack, bad: Stack,
                 prefer: str | None = None) -> AxisChange:
    """The package whose version differs between two stacks: `prefer` if given, else the
    first of AXES that differs, else the first other package (by name) that does."""
    good_pkgs, bad_pkgs = _packages(good), _packages(bad)
    for axis in AXES:
        for pkgs, stack in ((good_pkgs, good), (bad_pkgs, bad)):
            if stack.get(axis) and canonicalize_name(axis) not in pkgs:
                pkgs[canonicalize_name(axis)] = str(stack.get(axis))
    names = [canonicalize_name(prefer)] if prefer else [
        *map(canonicalize_name, AXES),
        *sorted(set(good_pkgs) | set(bad_pkgs))]
    for name in names:
        old, new = good_pkgs.get(name), bad_pkgs.get(name)
        if old is not None and new is not None and old != new:
            return _endpoints(name, old, new)
        if prefer:
            raise BisectError(f"{prefer} is {old or 'absent'} in the green run and "
                              f"{new or 'absent'} in the red one: nothing to bisect on that axis")
    if good.torch_git != bad.torch_git:
        raise BisectError("only torch's git hash differs (same version string): a source build; "
                          "bisect its commits with --source git")
    raise BisectError("the green and red runs have the same package versions: the change is "
                      "elsewhere (fixes, image, driver, device); compare their stacks")


def _packages(stack: Stack) -> dict[str, str]:
    out = {}
    for line in stack.packages or []:
        name, sep, version = str(line).partition("==")
        if sep:
            out[canonicalize_name(name)] = version
    return out


def _endpoints(package: str, good: str, bad: str) -> AxisChange:
    good_v, bad_v = _parse(package, good), _parse(package, bad)
    sources = {_source(good_v), _source(bad_v)}
    if len(sources) != 1:
        raise BisectError(f"{package} went from {good} to {bad}: a release and a nightly or source "
                          "build are not on one candidate list; give --good/--bad and --source")
    source = sources.pop()
    return AxisChange(package, source, _point(good_v, source), _point(bad_v, source), good, bad)


def _parse(package: str, text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise BisectError(f"{package} version {text!r} is not a PEP 440 version") from None


def _source(version: Version) -> str:
    if version.dev is not None and 19000101 <= version.dev <= 29991231:
        return "nightly"
    if version.local and _GIT_LOCAL.search(version.local):
        return "git"
    return "release"


def _point(version: Version, source: str) -> str:
    if source == "nightly":
        day = str(version.dev)
        return f"{day[:4]}-{day[4:6]}-{day[6:]}"
    if source == "git":
        return _GIT_LOCAL.search(version.local or "").group(1)  # type: ignore[union-attr]
    return version.public
