"""Candidate lists for the bisect engine, oldest first.

Four kinds, matching the Source kinds: releases on an index, nightlies by date on a
nightly index (PyTorch's, or any PEP 503 page of ``X.Y.devYYYYMMDD`` builds), the wheels
of one package in a local wheelhouse directory, and the commits of a local git clone.
Index pages are read by distci.provision.index.list_index_versions, the same code that resolves
cells, so a bisect lists exactly what a cell could have installed.

Every list is bounded by `first` (the oldest endpoint) and `last` (the newest), both
included; endpoints must exist, because the engine probes them to verify the question.
Without `first`, the list runs back from `last` as far as the source goes (or `limit`
candidates), for the engine's backward search from a lone end.
"""

from __future__ import annotations

import datetime as _dt
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

from packaging.tags import Tag, sys_tags
from packaging.version import InvalidVersion, Version

from distci.bisect.state import BisectError
from distci.errors import SourceError
from distci.provision.index import IndexEntry, list_find_links, list_index_versions
from distci.provision.index import nightly_date

WheelSource = Literal["release", "nightly", "wheelhouse"]


@dataclass(frozen=True)
class WheelCandidate:
    """One installable version of a package: a release, a nightly date or a wheelhouse
    version, with every file the location offers for it (all platforms kept out by
    `tags` already removed)."""

    package: str
    version: str
    source: WheelSource
    location: str
    date: _dt.date | None = None
    files: tuple[IndexEntry, ...] = field(default=(), compare=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def label(self) -> str:
        when = f" (nightly {self.date.isoformat()})" if self.date else ""
        return f"{self.package} {self.version}{when}"

    def pip_args(self) -> list[str]:
        """Where pip finds this candidate: the index, or only the wheelhouse; nothing for
        a release listed from pip's configuration (pip reads it itself)."""
        if not self.location:
            return []
        if self.source == "wheelhouse":
            return ["--no-index", "--find-links", self.location]
        return ["--index-url", self.location]

    def to_dict(self) -> dict[str, Any]:
        return {"package": self.package, "version": self.version, "source": self.source,
                "date": self.date.isoformat() if self.date else None,
                "files": [e.filename for e in self.files]}


@dataclass(frozen=True)
class CommitCandidate:
    """One commit of a local clone, installed from its tree by a probe."""

    repo: str
    commit: str
    subject: str
    committed: str

    @property
    def key(self) -> str:
        return self.commit

    @property
    def label(self) -> str:
        return f"{self.commit[:12]} {self.subject}"

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "subject": self.subject, "committed": self.committed}


class SwappedEndpoints(BisectError):
    """The old endpoint is newer than the new one: the caller names the roles (good/bad)."""


# -- wheels ------------------------------------------------------------------------------


def release_candidates(index_url: str, package: str, *, last: str, first: str | None = None,
                       prereleases: bool = False, tags: Iterable[Tag] | None = None,
                       limit: int | None = None, ca_bundle: str = "") -> list[WheelCandidate]:
    """Released versions of `package` on the index from `first` to `last`.

    One candidate per public version (``2.6.0`` covers ``2.6.0+cu126``): pip picks the
    file. Pre-releases and dev builds lie between releases only with `prereleases`; an
    endpoint may be one either way.
    """
    entries = list_index_versions(index_url, package, ca_bundle=ca_bundle)
    wanted = {_version(first, "first"), _version(last, "last")} - {None}
    groups = _group(_installable(entries, tags), lambda e: e.version.public, keep=lambda e: (
        prereleases or not e.version.is_prerelease or Version(e.version.public) in wanted))
    return _bounded([_wheel(package, "release", index_url, files) for files in groups],
                    first, last, by=lambda c: Version(c.version), parse=_version,
                    what=f"{package} release", where=index_url, limit=limit)


def merge_release_candidates(index_urls: Sequence[str], package: str, *, last: str,
                             first: str | None = None, limit: int | None = None,
                             ca_bundle: str = "") -> list[WheelCandidate]:
    """Releases of `package` on any of `index_urls` (pip's index and extra indexes), as one
    list whose candidates carry no location: pip finds them with its own configuration."""
    entries: list[IndexEntry] = []
    errors = []
    for url in index_urls:
        try:
            entries += list_index_versions(url, package, ca_bundle=ca_bundle)
        except SourceError as exc:
            errors.append(str(exc))
    if not entries and errors:
        raise SourceError("; ".join(errors))
    wanted = {_version(first, "first"), _version(last, "last")} - {None}
    groups = _group(_installable(entries, None), lambda e: e.version.public, keep=lambda e: (
        not e.version.is_prerelease or Version(e.version.public) in wanted))
    return _bounded([_wheel(package, "release", "", files) for files in groups], first, last,
                    by=lambda c: Version(c.version), parse=_version, what=f"{package} release",
                    where="the indexes of pip's configuration", limit=limit)


def nightly_candidates(index_url: str, package: str, *, last: str, first: str | None = None,
                       tags: Iterable[Tag] | None = None, limit: int | None = None,
                       ca_bundle: str = "", archive: Sequence[Path] = ()) -> list[WheelCandidate]:
    """One candidate per nightly date on the index from `first` to `last`.

    Endpoints are dates (``2026-11-20``, ``20261120``) or nightly versions
    (``2.12.0.dev20261120+cu130``). A date with several versions (the day the version
    was bumped) is the highest of them. `archive` lists wheel directories (distci's
    wheelhouse archive, see distci.provision.wheelhouse.archived): a nightly found there but no
    longer on the index is still a candidate, installed from the archive.
    """
    entries = [e for e in list_index_versions(index_url, package, ca_bundle=ca_bundle)
               if e.date is not None]
    groups = _group(_installable(entries, tags), lambda e: e.date)
    found = [_wheel(package, "nightly", index_url, files) for files in groups]
    dates = {c.date for c in found}
    for directory in archive:
        location = str(Path(directory).resolve())
        kept = [e for e in list_find_links(location, package) if e.date is not None]
        for files in _group(_installable(kept, tags), lambda e: e.date):
            if files[0].date not in dates:
                dates.add(files[0].date)
                found.append(_wheel(package, "wheelhouse", location, files))
    return _bounded(found, first, last, by=lambda c: c.date, parse=_date,
                    what=f"{package} nightly", where=index_url, limit=limit)


def wheelhouse_candidates(directory: Path | str, package: str, *, last: str,
                          first: str | None = None, tags: Iterable[Tag] | None = None,
                          limit: int | None = None) -> list[WheelCandidate]:
    """The versions of `package` in a directory of wheels, ordered by version.

    Nightlies kept in a wheelhouse outlive the nightly index (DESIGN rule 3), so
    endpoints may be versions or, for dev builds, dates.
    """
    location = str(Path(directory).resolve())
    groups = _group(_installable(list_find_links(location, package), tags), lambda e: e.version.public)
    found = [_wheel(package, "wheelhouse", location, files) for files in groups]
    if _is_date(last) or (first is not None and _is_date(first)):
        found, parse, by = [c for c in found if c.date], _date, (lambda c: c.date)
    else:
        parse, by = _version, (lambda c: Version(c.version))
    return _bounded(found, first, last, by=by, parse=parse, what=f"{package} wheel",
                    where=location, limit=limit)


def _installable(entries: Iterable[IndexEntry], tags: Iterable[Tag] | None) -> list[IndexEntry]:
    """Wheels this interpreter (or the given tags) can install; sdists are not candidates:
    building from source is the git axis."""
    wanted = set(sys_tags() if tags is None else tags)
    return [e for e in entries if not e.yanked and e.is_compatible(wanted)]


def _group(entries: list[IndexEntry], by, keep=lambda e: True) -> list[list[IndexEntry]]:
    groups: dict[Any, list[IndexEntry]] = {}
    for entry in entries:
        if keep(entry):
            groups.setdefault(by(entry), []).append(entry)
    return [groups[k] for k in sorted(groups)]


def _wheel(package: str, source: WheelSource, location: str,
           files: list[IndexEntry]) -> WheelCandidate:
    version = max(e.version for e in files)
    chosen = tuple(e for e in files if e.version == version)
    return WheelCandidate(package, version.public, source, location, nightly_date(version),
                          chosen)


def _bounded(found: list, first: str | None, last: str, *, by, parse, what: str, where: str,
             limit: int | None) -> list:
    """The candidates from endpoint `first` to endpoint `last`, both of which must exist."""
    found = sorted(found, key=by)
    position = {by(c): i for i, c in enumerate(found)}

    def index_of(text: str, name: str) -> int:
        wanted = parse(text, name)
        if wanted not in position:
            near = ", ".join(str(by(c)) for c in _nearest(found, by, wanted))
            raise SourceError(f"no {what} {text} on {where} for this platform"
                              + (f"; nearest: {near}" if near else "; it lists none"))
        return position[wanted]

    end = index_of(last, "last")
    start = index_of(first, "first") if first is not None else 0
    if start > end:
        raise SwappedEndpoints(f"{what} {first} is newer than {last}")
    if start == end:
        raise BisectError(f"both endpoints are {what} {last}")
    if first is None and limit is not None:
        start = max(0, end + 1 - limit)
    return found[start:end + 1]


def _nearest(found: list, by, wanted) -> list:
    older = [c for c in found if by(c) < wanted][-2:]
    newer = [c for c in found if by(c) > wanted][:2]
    return older + newer


def _version(text: str | None, name: str = "") -> Version | None:
    if text is None:
        return None
    try:
        return Version(Version(text).public)
    except InvalidVersion:
        raise SourceError(f"{name} endpoint {text!r} is not a version") from None


_DATE = re.compile(r"^(\d{4})-?(\d{2})-?(\d{2})$")


def _is_date(text: str) -> bool:
    """A dashed date; ``20260302`` alone is also a valid version, so it does not count."""
    return bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", text))


def _version_date(text: str) -> _dt.date | None:
    try:
        return nightly_date(Version(text))
    except InvalidVersion:
        return None


def _date(text: str | None, name: str = "") -> _dt.date | None:
    """A nightly date from ``2026-11-20``, ``20261120`` or a nightly version."""
    if text is None:
        return None
    match = _DATE.match(text)
    try:
        if match:
            return _dt.date(*map(int, match.groups()))
    except ValueError:
        pass
    found = _version_date(text)
    if found is None:
        raise SourceError(f"{name} endpoint {text!r} is neither a date (YYYY-MM-DD) nor a "
                          "nightly version (X.Y.Z.devYYYYMMDD)")
    return found


# -- git ---------------------------------------------------------------------------------


def git_candidates(repo: Path | str, *, last: str, first: str | None = None,
                   limit: int | None = None) -> list[CommitCandidate]:
    """The commits from `first` to `last` on `last`'s first-parent chain, oldest first.

    The list is ``first`` followed by the commits of ``--first-parent first..last`` that
    are also in ``--ancestry-path first..last``, oldest first. Bisecting a list assumes a
    monotone answer along it, which holds only when every candidate contains all older
    ones, i.e. the list is a chain of ancestors:
    - ``--first-parent`` follows the mainline (what was on main after each landing), so
      each commit is an ancestor of the next. The full ``first..last`` set also holds
      side-branch commits in topological order, where an "older" commit need not be an
      ancestor of a newer one: the bad state can disappear and come back along the list.
      For PyTorch, torchao and torchtitan (linear, ghstack/squash history) the chain is
      the whole history anyway; in a merge-based repository the answer may be a merge,
      and a second bisect from its first to its second parent goes inside it.
    - ``--ancestry-path`` keeps only descendants of `first`, so when `first` sits on a
      merged side branch the list starts at the merge that brought it in, not at mainline
      commits that never contained it.
    `first` must be an ancestor of `last` (for two releases cut on branches, bisect between
    their merge-bases with main). Without `first`: `last`'s first-parent history, back to
    the root or `limit` commits.
    """
    repo = Path(repo)
    head = _rev_parse(repo, last, "last")
    if first is None:
        lines = _git(repo, "log", "--first-parent", "--format=%H%x1f%cI%x1f%s",
                     *([f"--max-count={limit}"] if limit else []), head)
        return [_commit(repo, line) for line in reversed(lines)]
    base = _rev_parse(repo, first, "first")
    if base == head:
        raise BisectError(f"first and last endpoints are the same commit {base[:12]}")
    if _is_ancestor(repo, head, base):
        raise SwappedEndpoints(f"{last} ({head[:12]}) is an ancestor of {first} ({base[:12]})")
    if not _is_ancestor(repo, base, head):
        raise BisectError(f"{first} is not an ancestor of {last}; "
                          "bisect needs a chain: use the merge-base with main "
                          f"(git merge-base {first} {last}) as the old endpoint")
    start = _git(repo, "log", "-1", "--format=%H%x1f%cI%x1f%s", base)
    mainline = _git(repo, "log", "--reverse", "--first-parent", "--format=%H%x1f%cI%x1f%s",
                    f"{base}..{head}")
    # git applies --ancestry-path along first parents only when both are given, which
    # loses the merge that brought a side-branch `first` in: intersect the two instead.
    descendants = set(_git(repo, "rev-list", "--ancestry-path", f"{base}..{head}"))
    chain = [line for line in mainline if line.split("\x1f", 1)[0] in descendants]
    return [_commit(repo, line) for line in start + chain]


def _is_ancestor(repo: Path, older: str, newer: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", older, newer],
                          capture_output=True).returncode == 0


def _commit(repo: Path, line: str) -> CommitCandidate:
    commit, committed, subject = line.split("\x1f", 2)
    return CommitCandidate(str(repo), commit, subject, committed)


def _rev_parse(repo: Path, rev: str, name: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet",
                           f"{rev}^{{commit}}"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceError(f"{name} endpoint {rev!r} is not a commit of {repo}")
    return proc.stdout.strip()


def _git(repo: Path, *args: str) -> list[str]:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceError(f"git {' '.join(args[:2])} failed in {repo}: {proc.stderr.strip()}")
    return [line for line in proc.stdout.splitlines() if line]
