"""Between two torch builds without the history: delta-debug their Python.

When the two endpoints are builds whose native parts are interchangeable (adjacent
nightlies, a release and its patch release), every difference that can flip a check
written in Python is in the shipped Python files (overlay.classify_file: torch/**.py
outside csrc, version.py excluded). Laying a subset of the bad build's Python over the
good build gives a runnable torch that is "the good build with those changes". Delta
debugging (Zeller's ddmin) over the differing files, then over the hunks of the files it
keeps, finds a smallest change that flips the check, offline, in O(k log n) probes for
k relevant changes among n.

A mixed overlay can fail for reasons of its own (a hunk that needs another hunk: an
ImportError). A probe counts as failing only when it fails the same way the bad build
does (same exit code and last line of output, numbers blanked); any other failure is unresolved, which
ddmin treats as "not this subset", so it cannot send the search to a wrong change.

The answer names the file and the hunk and prints `git log -S` terms: the hunk's most
distinctive added or removed line, to find the upstream commit in a pytorch clone.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from distci.bisect.checks import CommandCheck
from distci.bisect.install import EnvCache, InstallFailed, site_packages
from distci.bisect.overlay import classify_file, link_or_copy
from distci.bisect.state import BisectError

T = TypeVar("T")
Log = Callable[[str], None]


@dataclass(frozen=True)
class Hunk:
    """One change of a file: good lines [a0, a1) become the bad build's `new` lines."""

    path: str
    a0: int
    a1: int
    old: tuple[str, ...]
    new: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.path}:{self.a0 + 1}"

    def unified(self) -> str:
        head = f"@@ {self.path} -{self.a0 + 1},{self.a1 - self.a0} @@\n"
        return head + "".join(f"-{line}" for line in self.old) + "".join(f"+{line}" for line in self.new)

    def search_terms(self) -> list[str]:
        """Lines worth `git log -S`: the longest distinctive changed lines, stripped."""
        lines = {line.strip() for line in (*self.new, *self.old)}
        lines = {line for line in lines if len(line) > 8 and not line.startswith("#")}
        return sorted(lines, key=lambda line: (-len(line), line))[:2]


@dataclass
class PyDiffResult:
    files: list[str]
    hunks: list[Hunk]
    differing_files: int
    probes: int
    seconds: float
    log: list[dict[str, Any]] = field(default_factory=list)


def python_files(site: Path) -> dict[str, Path]:
    """Shipped Python files of an installed torch, by repository path."""
    found = {}
    for root in ("torch", "functorch"):
        for path in (site / root).rglob("*.py") if (site / root).is_dir() else ():
            rel = path.relative_to(site).as_posix()
            if classify_file(rel) == "python":
                found[rel] = path
    return found


def differing(good: Path, bad: Path) -> tuple[list[str], list[str], list[str]]:
    """(changed, added in bad, removed in bad) Python paths between two site-packages."""
    a, b = python_files(good), python_files(bad)
    changed = sorted(p for p in set(a) & set(b) if _digest(a[p]) != _digest(b[p]))
    return changed, sorted(set(b) - set(a)), sorted(set(a) - set(b))


def hunks_of(path: str, good: Path, bad: Path) -> list[Hunk]:
    old = good.read_text(errors="replace").splitlines(keepends=True)
    new = bad.read_text(errors="replace").splitlines(keepends=True)
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    return [Hunk(path, a0, a1, tuple(old[a0:a1]), tuple(new[b0:b1]))
            for tag, a0, a1, b0, b1 in ops if tag != "equal"]


def apply_hunks(good_text: str, hunks: Sequence[Hunk]) -> str:
    """`good_text` with `hunks` (all of one file, from hunks_of) applied."""
    lines = good_text.splitlines(keepends=True)
    for hunk in sorted(hunks, key=lambda h: h.a0, reverse=True):
        lines[hunk.a0:hunk.a1] = list(hunk.new)
    return "".join(lines)


def ddmin(items: Sequence[T], fails: Callable[[Sequence[T]], bool]) -> list[T]:
    """A 1-minimal subset of `items` for which `fails` holds (it must hold for all of them)."""
    current, n = list(items), 2
    while len(current) >= 2:
        chunks = [current[i * len(current) // n:(i + 1) * len(current) // n] for i in range(n)]
        for chunk in chunks:
            if fails(chunk):
                current, n = chunk, 2
                break
        else:
            for i in range(n):
                rest = [x for j, c in enumerate(chunks) if j != i for x in c]
                if n > 2 and fails(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), n * 2)
    return current


class PythonDiff:
    """Probes "the good build with these changes of the bad build's Python"."""

    def __init__(self, check: CommandCheck, cache: EnvCache, good_env: Path, bad_env: Path,
                 log: Log = print) -> None:
        self.check, self.cache, self.log = check, cache, log
        self.good_site, self.bad_site = site_packages(good_env), site_packages(bad_env)
        self.probes = 0
        self.records: list[dict[str, Any]] = []
        self.signature: tuple[str, str] | None = None
        self._memo: dict[str, bool] = {}

    def endpoints(self, good_env: Path, bad_env: Path) -> None:
        said = []
        for name, env in (("good build", good_env), ("bad build", bad_env)):
            started = time.monotonic()
            outcome, _, detail = self.check.run(env)
            self.probes += 1
            seconds = round(time.monotonic() - started, 1)
            self.log(f"probe {self.probes}: {name}: {outcome} ({seconds}s)")
            self.records.append({"probe": self.probes, "overlay": name, "outcome": outcome,
                                 "seconds": seconds})
            said.append(outcome)
        good, outcome = said
        if good != "good" or outcome != "bad":
            raise BisectError(f"the endpoints do not differ as asked: good build probes {good}, "
                              f"bad build probes {outcome}")
        self.signature = _signature(detail)

    def fails(self, changes: dict[str, str | None], label: str) -> bool:
        """Overlay `changes` (path -> new text, None: delete) on the good build; does the
        check fail the way the bad build does?"""
        key = _digest_text("\0".join(f"{p}\0{t}" for p, t in sorted(changes.items(), key=lambda x: x[0])
                                     if t is not None) + "|" + ",".join(sorted(p for p, t in changes.items() if t is None)))
        if key in self._memo:
            return self._memo[key]

        def populate(venv: Path) -> None:
            target = site_packages(venv)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(self.good_site, target, copy_function=link_or_copy, symlinks=True)
            for path, text in changes.items():
                dest = target / path
                dest.unlink(missing_ok=True)
                if text is not None:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_text(text)

        started = time.monotonic()
        try:
            venv, _ = self.cache.ensure(f"pydiff-{key}", populate=populate)
        except InstallFailed as failed:
            raise BisectError(f"overlay failed: {failed}") from None
        outcome, _, detail = self.check.run(venv)
        failed = outcome == "bad" and _signature(detail) == self.signature
        self.probes += 1
        seconds = round(time.monotonic() - started, 1)
        said = "fails like the bad build" if failed else "passes" if outcome == "good" else (
            "unresolved (fails otherwise)")
        self.log(f"probe {self.probes}: {label}: {said} ({seconds}s)")
        self.records.append({"probe": self.probes, "overlay": label, "outcome": said, "seconds": seconds})
        shutil.rmtree(venv, ignore_errors=True)  # a one-off overlay: do not keep it warm
        self._memo[key] = failed
        return failed


def python_diff(check: CommandCheck, cache: EnvCache, good_env: Path, bad_env: Path,
                log: Log = print) -> PyDiffResult:
    """ddmin over the differing Python files, then over the hunks of the files kept."""
    started = time.monotonic()
    probe = PythonDiff(check, cache, good_env, bad_env, log)
    probe.endpoints(good_env, bad_env)
    changed, added, removed = differing(probe.good_site, probe.bad_site)
    paths = changed + added + removed
    log(f"python diff: {len(changed)} files changed, {len(added)} added, {len(removed)} removed")
    bad_text = {p: ((probe.bad_site / p).read_text(errors="replace") if p not in removed else None)
                for p in paths}
    if not paths or not probe.fails(bad_text, f"all {len(paths)} files"):
        raise BisectError("the bad build's Python over the good build does not fail like the bad "
                          "build: the difference is in native code; this mode cannot name it")
    files = ddmin(paths, lambda subset: probe.fails({p: bad_text[p] for p in subset},
                                                    f"{len(subset)} files: {', '.join(subset[:3])}"
                                                    + (" ..." if len(subset) > 3 else "")))
    log(f"python diff: smallest set of files: {', '.join(files)}")
    whole = {p: bad_text[p] for p in files}
    hunks = [h for p in files if p in changed for h in hunks_of(p, probe.good_site / p, probe.bad_site / p)]
    fixed = {p: t for p, t in whole.items() if p not in changed}  # added / removed files stay whole

    def with_hunks(subset: Sequence[Hunk]) -> dict[str, str | None]:
        out = dict(fixed)
        for path in {h.path for h in subset}:
            out[path] = apply_hunks((probe.good_site / path).read_text(errors="replace"),
                                    [h for h in subset if h.path == path])
        return out

    kept = ddmin(hunks, lambda subset: probe.fails(
        with_hunks(subset), f"{len(subset)} hunks: {', '.join(h.key for h in subset[:3])}"
        + (" ..." if len(subset) > 3 else ""))) if len(hunks) > 1 else hunks
    return PyDiffResult(files, kept, len(paths), probe.probes, round(time.monotonic() - started, 1),
                        probe.records)


def run_python_diff(args: Any, q: Any, log: Log) -> int:
    """`distci bisect --python-diff`: install both endpoints as probes would, then diff."""
    import json

    from distci.bisect.question import candidates_of, env_cache, make_check

    if q.axis != "torch":
        raise BisectError("--python-diff compares two torch builds (--axis torch)")
    if q.first is None:
        raise BisectError("--python-diff needs both --good and --bad")
    cache = env_cache(args, q, log)
    check = make_check(args, q, cache, log)
    ends = candidates_of(args, q)
    good, bad = (ends[0], ends[-1]) if not args.find_fix else (ends[-1], ends[0])
    envs = []
    for candidate in (good, bad):
        try:
            venv, warm = cache.ensure(candidate.key, lambda c=candidate: cache.wheel_install(c))
        except InstallFailed as failed:
            raise BisectError(f"{candidate.label} cannot be installed: {failed}") from None
        log(f"{candidate.label}: {'warm' if warm else 'installed'} at {venv}")
        envs.append(venv)
    result = python_diff(check, cache, envs[0], envs[1], log)
    for hunk in result.hunks:
        log(hunk.unified().rstrip())
        for term in hunk.search_terms():
            log(f"  search: git log -S{_quote(term)} -- {hunk.path}")
    log(f"python diff: {len(result.files)} file(s), {len(result.hunks)} hunk(s) of "
        f"{result.differing_files} differing files, {result.probes} probes, {result.seconds:.0f}s")
    report = Path(args.report) if args.report else Path(args.out) / "pydiff" / (
        f"{good.key}..{bad.key}.json".replace("/", "_"))
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps({
        "kind": "python-diff", "good": good.key, "bad": bad.key, "check": check.command,
        "files": result.files, "hunks": [{"key": h.key, "diff": h.unified(), "search": h.search_terms()}
                                         for h in result.hunks],
        "differing_files": result.differing_files, "probes": result.probes,
        "seconds": result.seconds, "log": result.log}, indent=1) + "\n")
    log(f"report: {report}")
    return 0


def _signature(detail: str) -> tuple[str, str]:
    """(exit line, last line of output) with numbers blanked: pids and times vary."""
    lines = [re.sub(r"\d+", "#", line) for line in detail.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "", lines[-1] if len(lines) > 1 else "")


def _quote(text: str) -> str:
    """Shell-quoted, in double quotes when that reads better (Python source has ' often)."""
    import shlex

    if "'" in text and not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digest_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
