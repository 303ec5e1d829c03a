"""Below the nightly: from two adjacent torch nightlies to the main commit that broke it.

A nightly bisect ends on two adjacent nightly builds. Their ``torch.version.git_version``
are commits of the nightly branch; nightly_map.py turns them into the main commits they
were built from, using a pytorch clone given by DISTCI_GIT_PYTORCH (it must have the
nightly branch: ``git fetch origin nightly main``). The main commits between them are
classified (overlay.py: Python-only, native, inert); the Python-only ones are bisected by
laying their shipped Python over the good (or bad) nightly's binary (OverlayProbe), the
native ones that no binary matches are reported as an unbisectable sub-range, and the
commits that are left are ranked by the files in the bad nightly's failing traceback
(suspects.py).

Without a clone, the range comes from GitHub's public compare API between the two main
commits (named by the nightly commits' subjects, read from the commits API): it is
listed and ranked, not probed. The requests go through the project's one GitHub client
(distci.provision.github: PyGithub's requester, rate-limit retries; $GITHUB_TOKEN when
set, anonymous otherwise). Set DISTCI_GITHUB_API to point elsewhere (a test's server).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any, Callable

from distci.bisect.candidates import WheelCandidate, git_candidates
from distci.bisect.checks import CommandCheck
from distci.bisect.engine import FLANKS, BisectRefused, BisectResult, bisect
from distci.bisect.install import EnvCache
from distci.bisect.nightly_map import main_range, parse_nightly_subject
from distci.bisect.overlay import classify_commit, classify_files, plan_overlays
from distci.bisect.probes import OverlayProbe
from distci.bisect.state import BisectState
from distci.bisect.suspects import rank_suspects
from distci.errors import ConfigError
from distci.provision.envs import env_python
from distci.provision.github import DEFAULT_API_URL, GitHub

REPO_ENV = "DISTCI_GIT_PYTORCH"
API_ENV = "DISTCI_GITHUB_API"
COMPARE_URL = "https://github.com/pytorch/pytorch/compare/{good}...{bad}"
SUSPECTS_SHOWN = 5
Log = Callable[[str], None]


def torch_git_version(cache: EnvCache, candidate: Any) -> str | None:
    """``torch.version.git_version`` of a probed torch candidate (its env exists), else None."""
    venv = cache.existing(candidate.key)
    if venv is None:
        return None
    proc = subprocess.run([str(env_python(venv)), "-c", "import torch; print(torch.version.git_version)"],
                          capture_output=True, text=True)
    sha = proc.stdout.strip()
    return sha if proc.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", sha) else None


def torch_commits(axis: str, cache: EnvCache, result: BisectResult[Any]) -> dict[str, str] | None:
    """The git_version of the two torch builds around a boundary, oldest first, and the
    compare URL between them (what a user without a pytorch clone looks up next)."""
    if axis != "torch" or result.kind != "boundary" or not isinstance(result.first_new, WheelCandidate):
        return None
    old, new = torch_git_version(cache, result.last_old), torch_git_version(cache, result.first_new)
    if old is None or new is None:
        return None
    return {"last_old": old, "first_new": new, "compare": COMPARE_URL.format(good=old, bad=new)}


def below_nightly(result: BisectResult[Any], q: Any, cache: EnvCache, check: CommandCheck,
                  where: Path, log: Log = print, *, repeats: int = 1,
                  confirm: int | bool = True, flanks: int = FLANKS) -> dict[str, Any]:
    """The stage after a torch nightly bisect (see the module doc); its report section.
    `repeats`, `confirm` and `flanks` are the nightly bisect's: one honesty contract for both."""
    if q.axis != "torch" or q.source not in ("nightly", "wheelhouse") or result.kind != "boundary":
        return {"status": "not-applicable",
                "reason": "needs a torch nightly bisect that ended on two adjacent nightlies"}
    ends = torch_commits(q.axis, cache, result)
    if ends is None:
        return {"status": "error", "reason": "the nightlies' torch.version.git_version is unknown"}
    old_env, new_env = cache.existing(result.last_old.key), cache.existing(result.first_new.key)
    repo = os.environ.get(REPO_ENV, "")
    if not repo:
        log(f"below the nightly: no {REPO_ENV}; listing the range from the compare API")
        return _from_api(ends, result, log)
    good_main, bad_main = main_range(repo, ends["last_old"], ends["first_new"], main=_main_ref(repo))
    if result.mode == "fix":
        good_main, bad_main = bad_main, good_main
    commits = git_candidates(repo, first=good_main, last=bad_main)
    classes = [classify_commit(repo, c.commit) for c in commits]
    plans = plan_overlays(classes)
    native = [c.commit for c, k in zip(commits[1:], classes[1:]) if k.kind == "native"]
    log(f"below the nightly: main {good_main[:12]} .. {bad_main[:12]}: {len(commits) - 1} commits, "
        f"{sum(k.kind == 'python' for k in classes[1:])} Python-only, {len(native)} native, "
        f"{sum(p.binary is None for p in plans)} without a matching binary")
    probe = OverlayProbe(check, cache, repo, good=(good_main, old_env), bad=(bad_main, new_env),
                         plans=plans)
    state = BisectState.open(where / "below-nightly.json", {"good": good_main, "bad": bad_main,
                                                             "check": check.command})
    traceback = _bad_detail(result)
    section: dict[str, Any] = {"good_main": good_main, "bad_main": bad_main,
                               "compare": COMPARE_URL.format(good=good_main, bad=bad_main),
                               "commits": len(commits) - 1, "native": native,
                               "list": [{"commit": c.commit, "subject": c.subject, "kind": k.kind,
                                         "binary": p.binary} for c, k, p in zip(commits, classes, plans)][1:]}
    try:
        found = bisect(commits, probe, find_fix=result.mode == "fix", state=state, repeats=repeats,
                       confirm=confirm, flanks=flanks, on_event=lambda event: log(f"  below: {event}"))
    except BisectRefused as refused:
        section.update(status="refused", reason=refused.result.reason)
        log(f"below the nightly: refused: {refused.result.reason}")
        found = None
    if found is not None:
        section.update(status=found.kind, probes=len(found.probes),
                       range=[c.commit for c in found.range])
        if found.kind in ("flaky", "came-and-went"):
            log(f"below the nightly: {found.kind.upper()}, no commit named: {found.reason}")
            section["reason"] = found.reason
        elif found.kind == "boundary":
            section["culprit"] = found.first_new.commit
            log(f"below the nightly: first {'bad' if found.mode == 'regression' else 'good'} main "
                f"commit {found.first_new.commit[:12]} {found.first_new.subject} "
                f"({len(found.probes)} probes)")
        else:
            section["reason"] = f"{len(found.range)} main commits could not be split"
            log(f"below the nightly: {len(found.range)} commits could not be split (native "
                f"changes, no matching binary): {found.last_old.commit[:12]} .. "
                f"{found.first_new.commit[:12]}")
        pool = found.range
    else:
        pool = commits[1:]
    ranked = rank_suspects([(c.commit, c.subject, k.files) for c, k in zip(commits, classes)
                            if c in pool], traceback)
    section["suspects"] = [{"commit": s.commit, "subject": s.subject, "score": s.score,
                            "files": list(s.shared)} for s in ranked[:SUSPECTS_SHOWN]]
    for s in ranked[:SUSPECTS_SHOWN] if len(pool) > 1 else ():
        log(f"  suspect {s.commit[:12]} (score {s.score:g}) {s.subject}")
    return section


def _main_ref(repo: str) -> str:
    for ref in ("origin/main", "main"):
        if subprocess.run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", ref],
                          capture_output=True).returncode == 0:
            return ref
    return "origin/main"


def _bad_detail(result: BisectResult[Any]) -> str:
    """What the check printed on the first new candidate: the failing traceback."""
    for record in result.probes:
        if record.candidate == result.first_new and record.runs:
            return record.runs[-1].detail
    return ""


def _from_api(ends: dict[str, str], result: BisectResult[Any], log: Log) -> dict[str, Any]:
    """The range from the compare API (listed and ranked, not probed)."""
    client = _client()

    def get(path: str) -> dict[str, Any]:
        return client.request("GET", path)[1] or {}

    try:
        mains = []
        for sha in (ends["last_old"], ends["first_new"]):
            subject = get(f"/commits/{sha}")["commit"]["message"].splitlines()[0]
            parsed = parse_nightly_subject(subject)
            mains.append(parsed[1] if parsed else sha)
        compare = get(f"/compare/{mains[0]}...{mains[1]}")
        commits = [(c["sha"], c["commit"]["message"].splitlines()[0],
                    [f["filename"] for f in get(f"/commits/{c['sha']}").get("files", [])])
                   for c in compare.get("commits", [])]
    except (ConfigError, ValueError, KeyError) as exc:
        return {"status": "error", "reason": f"compare API: {exc}; set {REPO_ENV} to a clone"}
    classes = [classify_files(sha, files) for sha, _, files in commits]
    ranked = rank_suspects(commits, _bad_detail(result))
    log(f"below the nightly: {len(commits)} main commits {mains[0][:12]} .. {mains[1][:12]} "
        f"(not probed: no clone)")
    return {"status": "listed", "good_main": mains[0], "bad_main": mains[1],
            "compare": COMPARE_URL.format(good=mains[0], bad=mains[1]), "commits": len(commits),
            "native": [c.commit for c in classes if c.kind == "native"],
            "suspects": [{"commit": s.commit, "subject": s.subject, "score": s.score,
                          "files": list(s.shared)} for s in ranked[:SUSPECTS_SHOWN]]}


def _client() -> GitHub:
    """pytorch/pytorch through the GitHub client; the token only for the public API (a
    test's server or a mirror never sees it)."""
    api = os.environ.get(API_ENV, "").rstrip("/")
    token = "" if api else (os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN") or "")
    return GitHub(repo="pytorch/pytorch", token=token, api_url=api or DEFAULT_API_URL, write_interval=0)
