"""`distci bisect python-diff`: between two torch builds, the Python change that flips a check.

What it does, in order, so a cold run needs nothing but an index:
1. the endpoints: two versions (release, nightly or wheelhouse); given the wrong way
   round they are called swapped, with the --find-fix hint, before anything downloads;
2. the plan (builds.py): the bad build's dependencies resolved from its own metadata
   with pip's configuration, the downloads' sizes, the disk and time they need, printed
   and checked against the free disk before the first download;
3. one base env of those dependencies (shared by both builds and every overlay), each
   build alone over it, then the search (pydiff.py) under the honesty contract
   (--repeats, --confirm), every run saved in a state keyed on every input, so the same
   command resumes (the `rerun:` line prints it);
4. the pointer upstream (upstream.py): both builds' git hashes, the compare URL, the
   `git log -S` terms, and with a GitHub token the merged pull requests that touch the
   lines found.
The JSON report (and --markdown) is written whatever the end: a flaky, unconfirmed or
refused search reports what it learned so far, and exits non-zero.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from packaging.version import InvalidVersion, Version

from distci.bisect.args import BisectArgs
from distci.bisect.builds import BuildPlan, cached_plan, check_disk, plan_builds
from distci.bisect.candidates import WheelCandidate
from distci.bisect.install import Base, EnvCache, InstallFailed
from distci.bisect.pydiff import PyDiffResult, PyDiffStop, python_diff, quote_term
from distci.bisect.state import BisectError, BisectState
from distci.bisect.upstream import Pointer, pointer_upstream

Log = Callable[[str], None]
EXIT = {"found": 0, "flaky": 1, "unconfirmed": 1, "refused": 2}


def run_python_diff(args: BisectArgs, q: Any, log: Log) -> int:
    from distci.bisect.question import args_digest, env_cache, index_setting, make_check, question_meta

    if q.axis != "torch":
        raise BisectError("python-diff compares two torch builds (--axis torch)")
    if q.first is None or q.last is None:
        raise BisectError("python-diff needs both --good and --bad")
    good, bad = endpoints(args, q)
    base_cache = env_cache(args, q, log)
    plan: BuildPlan | None = None
    if args.base_env:
        cache = base_cache
        log(f"dependencies: from --base-env {args.base_env} as it is")
    else:
        log(f"plan: resolving {bad.requirement}'s dependencies from its own metadata "
            f"(pip's configuration{', ' + index_setting(args, q) if index_setting(args, q) else ''})")
        pip_args = [*_index_args(good), *base_cache.pip_args]
        from distci.provision.pipconfig import resolution_environment

        key = _digest(json.dumps([good.requirement, bad.requirement, sorted(args.check_requires), pip_args,
                                  os.path.abspath(args.python), resolution_environment(args.python)]))
        saved = Path(args.cache) / "plans" / f"{key}.json"
        if args.fresh:
            saved.unlink(missing_ok=True)
        plan = cached_plan(saved, lambda: plan_builds(
            good.requirement, bad.requirement, args.check_requires, pip_args, python=args.python, log=log), log)
        log(f"plan: {len(plan.base_requirements)} dependencies shared by both builds and every "
            f"overlay ({plan.resolve_seconds:.0f}s to resolve)")
        log(plan.describe())
        check_disk(plan, Path(args.cache), log)
        cache = replace(base_cache, base=Base(requirements=tuple(plan.base_requirements),
                                              install_args=("--no-deps",)))
    check = make_check(args, q, cache, log)
    meta = dict(question_meta(args, q, cache, check, None), mode="python-diff", good=good.key,
                bad=bad.key, narrow=args.narrow)
    state_path = Path(args.state) if args.state else Path(args.out) / "runs" / args_digest(
        [json.dumps(meta, sort_keys=True)]) / "state.json"
    if args.fresh:
        state_path.unlink(missing_ok=True)
    report = Path(args.report) if args.report else state_path.with_name(
        f"pydiff-{good.version}..{bad.version}.json".replace("/", "_"))
    rerun = shlex.join(["nox", "-s", "bisect", "--", *q.argv])
    log(f"state: {state_path} (interrupted? rerun: {rerun})")
    started = time.monotonic()
    envs = []
    for candidate in (good, bad):
        try:
            venv, warm = cache.ensure(candidate.key, lambda c=candidate: cache.wheel_install(c))
        except InstallFailed as failed:
            raise BisectError(f"{candidate.label} cannot be installed: {failed}\n{failed.log[-1500:]}") from None
        log(f"{candidate.label}: {'warm' if warm else 'installed'} at {venv} "
            f"({time.monotonic() - started:.0f}s so far)")
        envs.append(venv)
    setup_seconds = round(time.monotonic() - started, 1)
    state = BisectState.open(state_path, meta)
    try:
        result = python_diff(check, cache, envs[0], envs[1], log, repeats=args.repeats,
                             confirm=args.confirm, state=state, narrow=args.narrow)
    except PyDiffStop as stop:
        result = stop.result
    pointer = pointer_upstream(envs[0], envs[1], result.lines or result.hunks, log=log)
    _print_answer(result, pointer, log)
    data = report_data(result, pointer, good=good, bad=bad, check=check.command, meta=meta,
                       rerun=rerun, plan=plan, setup_seconds=setup_seconds, disk=_disk(cache, envs))
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(data, indent=1) + "\n")
    log(f"report: {report}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(to_markdown(data))
        log(f"markdown: {args.markdown}")
    if result.kind == "refused":
        raise BisectError(result.reason)
    if result.kind != "found":
        print(f"distci: bisect: no change named ({result.kind}): {result.reason}", file=sys.stderr)
    return EXIT[result.kind]


def endpoints(args: BisectArgs, q: Any) -> tuple[WheelCandidate, WheelCandidate]:
    """(good build, bad build); swapped versions are refused before any download."""
    from distci.bisect.question import index_url

    first, last = q.first, q.last
    if q.source == "release" and not args.wheelhouse:
        url = index_url(args, q, required=False)
        try:
            older, newer = Version(first), Version(last)
        except InvalidVersion as bad:
            raise BisectError(f"python-diff endpoints must be versions: {bad}") from None
        if older > newer:
            roles = ("--bad", "--good") if args.find_fix else ("--good", "--bad")
            hint = ("without --find-fix to find where it broke" if args.find_fix
                    else "with --find-fix to find where it was fixed")
            raise BisectError(f"the endpoints are swapped: {roles[0]} {first} is newer than "
                              f"{roles[1]} {last}; swap --good and --bad, or rerun {hint}")
        ends = [WheelCandidate(q.axis, v, "release", url) for v in (first, last)]
    else:
        from distci.bisect.question import question_candidates

        listed = question_candidates(args, q)
        ends = [listed[0], listed[-1]]
    good, bad = (ends[1], ends[0]) if args.find_fix else (ends[0], ends[1])
    return good, bad


def _index_args(candidate: WheelCandidate) -> list[str]:
    return candidate.pip_args() if candidate.location else []


def _print_answer(result: PyDiffResult, pointer: Pointer, log: Log) -> None:
    shown = result.lines or result.hunks
    for hunk in shown:
        log(hunk.unified().rstrip())
        for term in hunk.search_terms():
            log(f"  search: git log -S{quote_term(term)} -- {hunk.path}")
    for line in pointer.lines():
        log(line)
    verb = {"found": "found", "flaky": "FLAKY, nothing named", "unconfirmed": "NOT CONFIRMED, nothing named",
            "refused": "refused"}[result.kind]
    log(f"python diff: {verb}: {len(result.files)} file(s), {len(shown)} hunk(s) of "
        f"{result.differing_files} differing files, {result.probes} probes ({result.runs} check runs "
        f"this session), {result.seconds:.0f}s" + (f"; {result.reason}" if result.reason else ""))


def report_data(result: PyDiffResult, pointer: Pointer, *, good: WheelCandidate, bad: WheelCandidate,
                check: str, meta: dict[str, Any], rerun: str, plan: BuildPlan | None,
                setup_seconds: float, disk: int) -> dict[str, Any]:
    return {
        "kind": "python-diff", "status": result.kind, "reason": result.reason,
        "good": good.key, "bad": bad.key, "check": check,
        "files": result.files,
        "hunks": [_hunk(h) for h in result.hunks], "lines": [_hunk(h) for h in result.lines],
        "upstream": pointer.to_dict(),
        "differing_files": result.differing_files, "probes": result.probes, "check_runs": result.runs,
        "search_seconds": result.seconds, "setup_seconds": setup_seconds, "disk_bytes": disk,
        "plan": None if plan is None else {"base_requirements": plan.base_requirements,
                                           "estimate": plan.describe(),
                                           "estimated_disk_bytes": plan.disk_bytes()},
        "meta": meta, "resume": rerun, "log": result.log,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _hunk(hunk: Any) -> dict[str, Any]:
    return {"key": hunk.key, "diff": hunk.unified(), "search": hunk.search_terms()}


def to_markdown(data: dict[str, Any]) -> str:
    """The report as Markdown for reports/: command, answer, pointer upstream, probes."""
    up = data["upstream"]
    out = ["```", data["resume"], "```", "",
           f"**Result** ({data['status']}): {data['good']} -> {data['bad']}: "
           + (", ".join(data["files"]) if data["status"] == "found" else data["reason"]), ""]
    for hunk in data["lines"] or data["hunks"]:
        out += ["```diff", hunk["diff"].rstrip(), "```", ""]
        out += [f"- search: `git log -S{quote_term(t)} -- {hunk['key'].rsplit(':', 1)[0]}`"
                for t in hunk["search"]]
    out += ["", f"- good build git: `{up.get('good_git') or '?'}`",
            f"- bad build git: `{up.get('bad_git') or '?'}`",
            f"- compare: {up.get('compare') or '(unknown)'}"]
    for pr in up.get("pulls") or []:
        out.append(f"- pull request #{pr['number']}: {pr['title']} ({pr['url']})")
    if up.get("pulls_note"):
        out.append(f"- pull requests: {up['pulls_note']}")
    out += ["", f"{data['probes']} probes, {data['check_runs']} check runs, search "
            f"{data['search_seconds']:.0f} s, setup {data['setup_seconds']:.0f} s, "
            f"disk {data['disk_bytes'] / 1e9:.1f} GB", "",
            "| probe | phase | overlay | answer | seconds |", "|---:|---|---|---|---:|"]
    for row in data["log"]:
        out.append(f"| {row['probe']} | {row.get('phase', '')} | {row['overlay'].replace('|', '/')} | "
                   f"{row['outcome']}{' (state)' if row.get('resumed') else ''} | {row['seconds']} |")
    return "\n".join(out) + "\n"


def _disk(cache: EnvCache, envs: list[Path]) -> int:
    """Bytes the builds' envs and their base take (hard links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    roots = [*envs, *([cache.base_env()] if cache.base.requirements or cache.base.env else [])]
    for root in roots:
        if root is None:
            continue
        for path in Path(root).rglob("*"):
            try:
                st = path.lstat()
            except OSError:
                continue
            if path.is_file() and not path.is_symlink() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]
