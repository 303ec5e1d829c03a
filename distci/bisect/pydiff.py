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

The honesty contract of every bisect mode (engine.py) holds here too:
- every overlay is probed `repeats` times; runs that disagree (fails / passes /
  unresolved) end the search as `flaky`, naming the overlay and what it answered;
- with `confirm` (a count of fresh runs, True: the engine's CONFIRM_RUNS), the answer is
  re-probed before it is given: the good build, the good build with the kept changes, and
  the kept changes less each one of them, `confirm` fresh runs beyond the search's `repeats`
  runs each; if the kept changes do not fail, or a smaller set still fails, the answer is
  `unconfirmed` (exit 1), never named with exit 0;
- every run is recorded in a BisectState (keyed by the overlay's content), so a rerun of
  the same question resumes.

After the hunks, each kept hunk of more than one changed line is narrowed to the lines
that matter (ddmin over its removed and added lines) where the check allows it: a subset
that does not fail like the bad build (a syntax error, say) is simply not the answer.

The answer names the file, the hunk and the lines and gives `git log -S` terms: the most
distinctive changed lines, to find the upstream commit (upstream.py adds the compare URL
and, with a token, the pull requests).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from distci.bisect.checks import CommandCheck, failure_signature
from distci.bisect.engine import CONFIRM_RUNS
from distci.bisect.hunks import Hunk, apply_edits, apply_hunks, hunks_of, line_edits
from distci.bisect.install import EnvCache, InstallFailed, site_packages
from distci.bisect.overlay import classify_file, link_or_copy
from distci.bisect.state import BisectError, BisectState, ProbeRun

T = TypeVar("T")
Log = Callable[[str], None]


@dataclass
class PyDiffResult:
    """What the search found, or how far it got: `kind` is `found` (confirmed), `flaky`
    (an overlay's runs disagreed), `unconfirmed` (the re-probe contradicted the answer)
    or `refused`; `files` / `hunks` / `lines` are the smallest changes known so far."""

    kind: str
    files: list[str]
    hunks: list[Hunk]
    differing_files: int
    probes: int
    seconds: float
    log: list[dict[str, Any]] = field(default_factory=list)
    lines: list[Hunk] = field(default_factory=list)
    reason: str = ""
    runs: int = 0


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



class PyDiffStop(BisectError):
    """The search ended without a confirmed answer; `.result` holds what was learned."""

    def __init__(self, result: PyDiffResult) -> None:
        self.result = result
        super().__init__(result.reason)


FAILS, PASSES, UNRESOLVED = "fails like the bad build", "passes", "unresolved (fails otherwise)"


class PythonDiff:
    """Probes "the good build with these changes of the bad build's Python", each overlay
    `repeats` times, every run recorded in `state` under the overlay's content key."""

    def __init__(self, check: CommandCheck, cache: EnvCache, good_env: Path, bad_env: Path,
                 log: Log = print, *, repeats: int = 1, state: BisectState | None = None,
                 keep_overlays: bool = False) -> None:
        if repeats < 1:
            raise BisectError(f"repeats must be at least 1, got {repeats}")
        self.check, self.cache, self.log = check, cache, log
        self.good_env, self.bad_env = good_env, bad_env
        self.good_site, self.bad_site = site_packages(good_env), site_packages(bad_env)
        self.repeats = repeats
        self.keep_overlays = keep_overlays  # keep overlay envs warm (cheap: hard links)
        self.state = state or BisectState()
        self.probes = 0  # distinct overlays probed (endpoints included)
        self.runs = 0  # check runs this session
        self.records: list[dict[str, Any]] = []
        self.signature: tuple[str, str] | None = None
        self._seen: dict[str, list[str]] = {}
        self._number: dict[str, int] = {}

    # -- one overlay, `runs` times ------------------------------------------------------

    def observe(self, key: str, label: str, venv: Callable[[], Path], runs: int | None = None,
                phase: str = "search", one_off: bool = True) -> str:
        """FAILS, PASSES or UNRESOLVED for `key`, from `runs` agreeing runs in the env
        `venv()` makes (removed afterwards when `one_off`); raises PyDiffStop (flaky) when
        the runs disagree."""
        wanted = runs or self.repeats
        verdicts = self._seen.get(key)
        if verdicts is None:
            verdicts = self._seen[key] = []
            self.probes += 1
            self._number[key] = self.probes
            for run in self.state.runs(key):
                verdicts.append(self._verdict(run.outcome, run.detail))
                self.log(f"probe {self._number[key]}: {label}: {verdicts[-1]} (from state)")
                self.records.append({"probe": self._number[key], "overlay": label, "phase": phase,
                                     "outcome": verdicts[-1], "seconds": run.seconds, "resumed": True})
        env: Path | None = None
        try:
            while len(verdicts) < wanted and len(set(verdicts)) <= 1:
                if env is None:
                    env = venv()
                started = time.monotonic()
                outcome, reason, detail = self.check.run(env)
                seconds = round(time.monotonic() - started, 1)
                self.runs += 1
                self.state.record(key, ProbeRun(outcome, seconds, detail=detail[-2000:], reason=reason))
                verdicts.append(self._verdict(outcome, detail))
                run_no = f" (run {len(verdicts)}/{wanted})" if wanted > 1 else ""
                self.log(f"probe {self._number[key]}: {label}{run_no}: {verdicts[-1]} ({seconds}s)"
                         + ("" if outcome != "skip" else "\n" + _indented(detail)))
                self.records.append({"probe": self._number[key], "overlay": label, "phase": phase,
                                     "outcome": verdicts[-1], "seconds": seconds})
        finally:
            if env is not None and one_off:
                shutil.rmtree(env, ignore_errors=True)  # a one-off overlay: do not keep it warm
        if len(set(verdicts)) > 1:
            raise PyDiffStop(self.partial("flaky", f"{label} is flaky: {len(verdicts)} runs answered "
                                          f"{'; '.join(verdicts)}; no change can be named"))
        return verdicts[0]

    def _verdict(self, outcome: str, detail: str) -> str:
        if self.signature is None:  # the endpoints themselves: good / bad as the check says
            return {"good": PASSES, "bad": FAILS}.get(outcome, UNRESOLVED)
        if outcome == "good":
            return PASSES
        return FAILS if outcome == "bad" and failure_signature(detail) == self.signature else UNRESOLVED

    # -- the endpoints ------------------------------------------------------------------

    def endpoints(self, runs: int | None = None) -> None:
        """Both builds as they are: the good one must pass, the bad one fail (`runs` each)."""
        said, details = [], []
        for name, env, key in (("good build", self.good_env, "endpoint:good"),
                               ("bad build", self.bad_env, "endpoint:bad")):
            said.append(self.observe(key, name, (lambda e=env: e), runs, phase="verify", one_off=False))
            details.append(self.state.runs(key)[-1].detail if self.state.runs(key) else "")
        good, bad = said
        if good == FAILS and bad == PASSES:
            raise PyDiffStop(self.partial("refused", "the endpoints are swapped: the good build fails "
                                          "and the bad build passes; swap --good and --bad, or rerun "
                                          "with --find-fix to find where it was fixed"))
        if good != PASSES or bad != FAILS:
            shown = "".join(f"\n{name} ({verdict}), the check's last lines:\n{_indented(detail)}"
                            for name, verdict, detail in zip(("good build", "bad build"), said, details)
                            if verdict == UNRESOLVED)
            raise PyDiffStop(self.partial("refused", f"the endpoints do not differ as asked: good build "
                                          f"{_short(good)}, bad build {_short(bad)}{shown}"))
        self.signature = failure_signature(details[1])

    # -- overlays -----------------------------------------------------------------------

    def fails(self, changes: dict[str, str | None], label: str, runs: int | None = None,
              phase: str = "search") -> bool:
        """Overlay `changes` (path -> new text, None: delete) on the good build; does the
        check fail the way the bad build does?"""
        key = overlay_key(changes)

        def make() -> Path:
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
            try:
                return self.cache.ensure(f"pydiff-{key}", populate=populate)[0]
            except InstallFailed as failed:
                raise BisectError(f"overlay failed: {failed}") from None

        return self.observe(f"pydiff-{key}", label, make, runs, phase,
                            one_off=not self.keep_overlays) == FAILS

    def partial(self, kind: str, reason: str, **found: Any) -> PyDiffResult:
        return PyDiffResult(kind, found.get("files", []), found.get("hunks", []),
                            found.get("differing", 0), self.probes, 0.0, self.records,
                            lines=found.get("lines", []), reason=reason, runs=self.runs)


def overlay_key(changes: dict[str, str | None]) -> str:
    """The content key of an overlay: what it writes and what it deletes."""
    return _digest_text("\0".join(f"{p}\0{t}" for p, t in sorted(changes.items()) if t is not None)
                        + "|" + ",".join(sorted(p for p, t in changes.items() if t is None)))


def _label(prefix: str, items: Sequence[Any], name: Callable[[Any], str]) -> str:
    return f"{len(items)} {prefix}: {', '.join(name(x) for x in items[:3])}" + (" ..." if len(items) > 3 else "")


def python_diff(check: CommandCheck, cache: EnvCache, good_env: Path, bad_env: Path,
                log: Log = print, *, repeats: int = 1, confirm: int | bool = True,
                state: BisectState | None = None, narrow: bool = True,
                keep_overlays: bool = False) -> PyDiffResult:
    """ddmin over the differing Python files, then the hunks of the files kept, then the
    lines of each hunk kept; with `confirm` the answer is re-probed before it is given.
    Raises PyDiffStop (with what was learned) when there is no confirmed answer."""
    started = time.monotonic()
    probe = PythonDiff(check, cache, good_env, bad_env, log, repeats=repeats, state=state,
                       keep_overlays=keep_overlays)
    found: dict[str, Any] = {}

    def stop(kind: str, reason: str) -> PyDiffStop:
        return PyDiffStop(probe.partial(kind, reason, **found))

    try:
        probe.endpoints()
        changed, added, removed = differing(probe.good_site, probe.bad_site)
        paths = changed + added + removed
        found.update(differing=len(paths), files=paths)
        log(f"python diff: {len(changed)} files changed, {len(added)} added, {len(removed)} removed")
        bad_text = {p: ((probe.bad_site / p).read_text(errors="replace") if p not in removed else None)
                    for p in paths}
        if not paths:
            raise stop("refused", "no shipped Python file differs (version.py aside): the difference "
                                  "is in native code; this mode cannot name it")
        if not probe.fails(bad_text, f"all {len(paths)} files"):
            raise stop("refused", f"the bad build's Python over the good build does not fail like the "
                                  f"bad build ({probe.repeats} run(s) agreed): the difference is in native "
                                  "code, or needs more than Python; this mode cannot name it")
        files = ddmin(paths, lambda subset: probe.fails({p: bad_text[p] for p in subset},
                                                        _label("files", subset, str)))
        found["files"] = files
        log(f"python diff: smallest set of files: {', '.join(files)}")
        fixed = {p: bad_text[p] for p in files if p not in changed}  # added / removed files stay whole
        hunks = [h for p in files if p in changed for h in hunks_of(p, probe.good_site / p, probe.bad_site / p)]

        def with_hunks(subset: Sequence[Hunk]) -> dict[str, str | None]:
            out = dict(fixed)
            for path in sorted({h.path for h in subset}):
                out[path] = apply_hunks((probe.good_site / path).read_text(errors="replace"),
                                        [h for h in subset if h.path == path])
            return out

        kept = ddmin(hunks, lambda subset: probe.fails(with_hunks(subset), _label(
            "hunks", subset, lambda h: h.key))) if len(hunks) > 1 else hunks
        found["hunks"] = kept
        lines = list(kept)
        if narrow:
            lines = [_narrow(probe, hunk, [h for h in kept if h is not hunk], with_hunks) for hunk in kept]
        found["lines"] = lines
        fresh = CONFIRM_RUNS if confirm is True else int(confirm)
        if fresh:
            _confirm(probe, lines, with_hunks, stop, fresh)
    except PyDiffStop as stopped:  # report what was learned before it stopped
        learned = stopped.result
        learned.files = learned.files or found.get("files", [])
        learned.hunks = learned.hunks or found.get("hunks", [])
        learned.lines = learned.lines or found.get("lines", [])
        learned.differing_files = learned.differing_files or found.get("differing", 0)
        learned.seconds = round(time.monotonic() - started, 1)
        raise
    return PyDiffResult("found", files, kept, len(paths), probe.probes, round(time.monotonic() - started, 1),
                        probe.records, lines=lines, runs=probe.runs)


def _narrow(probe: PythonDiff, hunk: Hunk, others: list[Hunk],
            with_hunks: Callable[[Sequence[Hunk]], dict[str, str | None]]) -> Hunk:
    """`hunk` cut to the one-line edits that still fail like the bad build (with the other
    kept hunks applied); the whole hunk when it has one line or the check allows no cut."""
    edits = line_edits(hunk)
    if len(edits) < 2:
        return hunk
    kept = ddmin(edits, lambda subset: probe.fails(
        with_hunks([*others, apply_edits(hunk, subset)]), _label(f"lines of {hunk.key}", subset,
                                                                   lambda e: e.name(hunk))))
    if len(kept) == len(edits):
        return hunk
    probe.log(f"python diff: {hunk.key}: {len(kept)} of {len(edits)} changed lines matter")
    return apply_edits(hunk, kept).trimmed()


def _confirm(probe: PythonDiff, lines: list[Hunk], with_hunks: Callable[[Sequence[Hunk]], dict[str, str | None]],
             stop: Callable[[str, str], PyDiffStop], fresh: int) -> None:
    """Re-probe the answer with `fresh` runs beyond the search's `repeats` (never only the
    runs that found it): the good build passes, the good build with
    the kept changes fails like the bad build, and without any one of them it does not."""
    runs = probe.repeats + fresh
    probe.endpoints(runs)
    applied = list(lines)
    if not probe.fails(with_hunks(applied), f"confirm: the {len(applied)} change(s) found",
                       runs, phase="confirm"):
        raise stop("unconfirmed", "the changes found do not fail like the bad build when probed again: "
                                  "the check is not steady; rerun with more --repeats")
    for i, hunk in enumerate(applied):
        rest = applied[:i] + applied[i + 1:]
        if probe.fails(with_hunks(rest), f"confirm: without {hunk.key}", runs, phase="confirm"):
            raise stop("unconfirmed", f"without {hunk.key} the overlay still fails like the bad build: "
                                      "the answer is not the smallest; the check is not steady")


def _short(verdict: str) -> str:
    return {FAILS: "fails", PASSES: "passes", UNRESOLVED: "skips or fails otherwise"}[verdict]


def _indented(detail: str, lines: int = 12) -> str:
    return "\n".join("    " + line for line in detail.strip().splitlines()[-lines:])


def quote_term(text: str) -> str:
    """Shell-quoted, in double quotes when that reads better (Python source has ' often)."""
    import shlex

    if "'" in text and not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digest_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
