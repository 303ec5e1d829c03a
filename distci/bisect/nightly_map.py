"""Map torch builds to commits of PyTorch's main branch.

A nightly's ``torch.version.git_version`` is not a main commit: it is a commit on the
``nightly`` branch, made by the release bot, whose subject names the main commit the
build came from: ``2026-11-20 nightly release (0123abcd...)``. Bisecting below two
nightlies means bisecting main between the two commits those subjects name. A release is
cut on a release branch; its main counterpart is the merge-base of its tag with main.

All of this reads a local clone (with the nightly branch fetched): no network here.
"""

from __future__ import annotations

import datetime as _dt
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from distci.bisect.state import BisectError
from distci.errors import SourceError

_SUBJECT = re.compile(r"^(\d{4}-\d{2}-\d{2}) nightly release \(([0-9a-f]{7,40})\)\s*$")


@dataclass(frozen=True)
class NightlyCommit:
    """A commit of the nightly branch and the main commit it was built from."""

    nightly: str
    date: _dt.date
    main: str


def parse_nightly_subject(subject: str) -> tuple[_dt.date, str] | None:
    """(build date, main commit as written) from a nightly branch subject, else None."""
    match = _SUBJECT.match(subject.strip())
    if not match:
        return None
    return _dt.date.fromisoformat(match.group(1)), match.group(2)


def main_commit_of_nightly(repo: Path | str, git_version: str) -> NightlyCommit:
    """The main commit a nightly was built from, given its ``torch.version.git_version``."""
    repo = Path(repo)
    nightly = _rev(repo, git_version, "nightly git_version")
    subject = _git(repo, "log", "-1", "--format=%s", nightly)
    parsed = parse_nightly_subject(subject)
    if parsed is None:
        raise BisectError(f"commit {nightly[:12]} is not a nightly release commit (subject "
                          f"{subject!r}); is this git_version from a nightly build?",
                          where=str(repo))
    date, named = parsed
    return NightlyCommit(nightly, date, _rev(repo, named, f"main commit named by {nightly[:12]}"))


def main_commit_of_release(repo: Path | str, tag: str, main: str = "origin/main") -> str:
    """Where a release branched from main: the merge-base of its tag with `main`."""
    repo = Path(repo)
    return _git(repo, "merge-base", _rev(repo, tag, "release tag"), _rev(repo, main, "main"))


def main_range(repo: Path | str, good: str, bad: str, *, main: str = "origin/main") -> tuple[str, str]:
    """Main commits for two builds: each end is a nightly git_version (nightly branch
    commit), a release tag, or already a main commit."""
    return _to_main(Path(repo), good, main), _to_main(Path(repo), bad, main)


def _to_main(repo: Path, rev: str, main: str) -> str:
    sha = _rev(repo, rev, "endpoint")
    if parse_nightly_subject(_git(repo, "log", "-1", "--format=%s", sha)) is not None:
        return main_commit_of_nightly(repo, sha).main
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", sha,
                       _rev(repo, main, "main")], capture_output=True).returncode == 0:
        return sha
    return main_commit_of_release(repo, sha, main)


def _rev(repo: Path, rev: str, what: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet",
                           f"{rev}^{{commit}}"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceError(f"{what} {rev!r} is not in {repo}; fetch it first "
                          "(git fetch origin nightly main --tags)")
    return proc.stdout.strip()


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceError(f"git {args[0]} failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout.strip()
