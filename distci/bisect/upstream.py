"""A pointer upstream from two torch builds, without a pytorch clone.

Each torch build names the commit it was built from in ``torch/version.py``
(``git_version``). With both, the user has a compare URL to open, the `git log -S`
terms of the change found (pydiff.Hunk.search_terms), and, when a GitHub token is set
($GITHUB_TOKEN or $GH_TOKEN), the merged pull requests of that range whose diff touches
the file and the lines found: the compare API lists the range's commits, each commit's
files say whether it touched the file and whether its patch holds one of the changed
lines, and `commits/{sha}/pulls` names the pull request. The requests go through the
project's one GitHub client (distci.provision.github, PyGithub's requester with its
rate-limit retries); $DISTCI_GITHUB_API points it elsewhere (a test's server).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from distci.errors import ConfigError
from distci.provision.github import DEFAULT_API_URL, GitHub

UPSTREAM = "pytorch/pytorch"
COMPARE_URL = "https://github.com/{repo}/compare/{good}...{bad}"
API_ENV = "DISTCI_GITHUB_API"
MAX_COMMITS = 250  # what one compare answer lists
Log = Callable[[str], None]
_GIT_VERSION = re.compile(r"""^git_version\s*=\s*['"]([0-9a-f]{7,40})['"]""", re.MULTILINE)


@dataclass
class PullRequest:
    number: int
    title: str
    url: str
    commit: str
    merged_at: str | None = None


@dataclass
class Pointer:
    """Where to look upstream: the two builds' commits, the compare URL, the pull requests."""

    good_git: str | None
    bad_git: str | None
    repo: str = UPSTREAM
    pulls: list[PullRequest] = field(default_factory=list)
    pulls_note: str = ""

    @property
    def compare(self) -> str | None:
        if not (self.good_git and self.bad_git):
            return None
        return COMPARE_URL.format(repo=self.repo, good=self.good_git, bad=self.bad_git)

    def lines(self) -> list[str]:
        out = [f"good build: git {self.good_git or 'unknown (no git_version in torch/version.py)'}",
               f"bad build:  git {self.bad_git or 'unknown (no git_version in torch/version.py)'}"]
        if self.compare:
            out.append(f"compare: {self.compare}")
        out += [f"pull request #{p.number}: {p.title} ({p.url})" for p in self.pulls]
        if self.pulls_note:
            out.append(f"pull requests: {self.pulls_note}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"good_git": self.good_git, "bad_git": self.bad_git, "compare": self.compare,
                "pulls": [vars(p) for p in self.pulls], "pulls_note": self.pulls_note}


_GITHUB_REMOTE = re.compile(r"github\.com[:/]+([\w.-]+/[\w.-]+?)(?:\.git)?/?$")


def clone_compare(repo: Path | str, good: str, bad: str) -> str:
    """Where to read the change between two commits of a local clone: the GitHub compare
    URL when its `origin` is on GitHub, else the `git log` command that lists them."""
    import subprocess

    remote = subprocess.run(["git", "-C", str(repo), "remote", "get-url", "origin"],
                            capture_output=True, text=True).stdout.strip()
    found = _GITHUB_REMOTE.search(remote)
    if found:
        return COMPARE_URL.format(repo=found.group(1), good=good, bad=bad)
    return f"git -C {repo} log --first-parent {good}..{bad}"


def git_version(env: Path) -> str | None:
    """``git_version`` from the torch/version.py of a venv (or a site-packages dir)."""
    sites = [env] if (env / "torch").is_dir() else sorted((env / "lib").glob("python*/site-packages"))
    for site in sites:
        version = site / "torch" / "version.py"
        if version.is_file():
            found = _GIT_VERSION.search(version.read_text(errors="replace"))
            if found:
                return found.group(1)
    return None


def pointer_upstream(good_env: Path, bad_env: Path, hunks: Sequence[Any], *,
                     environ: dict[str, str] | None = None, log: Log = print) -> Pointer:
    """The pointer for two installed builds and the hunks found (pydiff.Hunk)."""
    env = dict(os.environ if environ is None else environ)
    pointer = Pointer(git_version(good_env), git_version(bad_env))
    token = env.get("GITHUB_TOKEN") or env.get("GH_TOKEN") or ""
    if not (pointer.good_git and pointer.bad_git):
        pointer.pulls_note = "not looked up: a build's git_version is unknown"
    elif not hunks:
        pointer.pulls_note = "not looked up: no change was named"
    elif not token:
        pointer.pulls_note = "not looked up: set GITHUB_TOKEN to list the pull requests touching these lines"
    else:
        client = GitHub(repo=UPSTREAM, token=token, api_url=env.get(API_ENV) or DEFAULT_API_URL,
                        write_interval=0)
        try:
            pointer.pulls = pulls_touching(client, pointer.good_git, pointer.bad_git, hunks)
            if not pointer.pulls:
                pointer.pulls_note = "no merged pull request of the range touches these lines"
        except ConfigError as exc:
            pointer.pulls_note = f"lookup failed: {exc}"
    return pointer


def pulls_touching(client: GitHub, good: str, bad: str, hunks: Sequence[Any]) -> list[PullRequest]:
    """Merged pull requests of good...bad with a commit whose patch touches `hunks`' lines."""
    _, compare, _ = client.request("GET", f"/compare/{good}...{bad}")
    commits = (compare or {}).get("commits", [])[:MAX_COMMITS]
    paths = {h.path for h in hunks}
    lines = {line.strip() for h in hunks for line in (*h.old, *h.new) if len(line.strip()) > 3}
    found: dict[int, PullRequest] = {}
    for commit in commits:
        sha = commit["sha"]
        _, detail, _ = client.request("GET", f"/commits/{sha}")
        touched = [f for f in (detail or {}).get("files", []) if f.get("filename") in paths]
        if not touched or not any(_patch_touches(f.get("patch", ""), lines) for f in touched):
            continue
        _, pulls, _ = client.request("GET", f"/commits/{sha}/pulls")
        for pr in pulls or []:
            if pr.get("merged_at") and pr["number"] not in found:
                found[pr["number"]] = PullRequest(pr["number"], pr.get("title", ""), pr.get("html_url", ""),
                                                  sha, pr.get("merged_at"))
    return list(found.values())


def _patch_touches(patch: str, lines: set[str]) -> bool:
    """Does a unified patch add or remove one of `lines` (stripped)?"""
    for line in patch.splitlines():
        if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip() in lines:
            return True
    return False
