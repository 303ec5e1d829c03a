"""The bisect engine: a pure search over an ordered list of candidates.

Candidates are ordered oldest to newest (releases, nightly dates, commits of a
first-parent chain). A probe answers `good`, `bad` or `skip` for one candidate; the
engine never installs or runs anything itself, so the same search serves wheels, nightly
dates and commits, and is tested exhaustively with plain functions as probes.

Looking for a regression, the old end is good and the new end bad, and the answer is the
first bad candidate. With `find_fix` the roles swap (old end bad, new end good, answer the
first good): internally both are "old state" and "new state", and the search looks for the
first candidate in the new state.

What the engine guarantees:
- Endpoints are probed first. If they do not differ, or one cannot be probed (skip), it
  refuses (BisectRefused) instead of bisecting a question with no answer.
- With both endpoints given, a monotone oracle costs at most ceil(log2 N) + 2 distinct
  probes (plus 2 * `flanks`). From a lone new end (`lone_end=True`) it steps backward 1, 2, 4, ... candidates
  until it finds the old state, then bisects: at most 2 ceil(log2 N) + 2.
- Skipped candidates are stepped around like `git bisect skip`; when only skipped
  candidates separate the last old from the first new, the result is a `range` holding
  exactly them and the first new one: the smallest range the probes can justify.
- With `repeats=r` every candidate is probed r times; any disagreement ends the search
  with a `flaky` result naming the candidate and what it answered. A boundary is reported
  only when both candidates around it answered the same way every time, so a wrong boundary
  needs one of those two to give the same wrong answer r times in a row.
- With `confirm=c` (True: CONFIRM_RUNS), the two candidates around the answer get c
  fresh runs each beyond the `repeats` the search made: the run that put the boundary
  there is never what confirms it. Every run of the pair must agree, else a `flaky`
  result with the outcomes. A wrong boundary then needs an endpoint to lie `repeats + c`
  times in a row; CONFIRM_RUNS is chosen by distci.bisect.simulate (a seeded check that
  flips each answer with probability p): no wrong boundary at p <= 0.2 there.
- The search assumes one flip (old state, then new state, once). After confirming, it
  probes `flanks` more candidates on each side, the middles of the widest stretches the
  search left unprobed (plus the neighbours of the pair), with `repeats` runs each; one
  that answers the other side's state is run until it has `repeats + c` agreeing runs,
  and then the answer is `came-and-went` (the behaviour flipped more than once: the
  boundary found may not be the change looked for), naming that candidate.
- Every run goes through the optional BisectState before and after the probe, so a state
  file makes an interrupted bisect resume where it stopped. A skip whose reason is
  `infra` (the environment could not be built) is not replayed from the state: the next
  bisect probes that candidate again, since the infrastructure may have been fixed.
- A probe run may carry a reason (`timeout`, `infra`, `native`); the result counts them
  (`reasons`), so a summary says how many probes timed out instead of hiding them in
  skip or bad.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Generic, Literal, NoReturn, Sequence

from distci.bisect.result import (ONE_FLIP, BisectRefused, BisectResult, C, Kind, ProbeFn, ProbeOutcome,
                                  ProbeRecord, Progress, candidate_key)
from distci.bisect.state import BisectError, BisectState, ProbeRun

__all__ = ["CONFIRM_RUNS", "FLANKS", "BisectRefused", "BisectResult", "ProbeOutcome", "ProbeRecord", "Progress",
           "bisect", "candidate_key"]  # the records live in result.py; the engine is their face

CONFIRM_RUNS = 5
"""Fresh runs per side of the answer that `confirm=True` makes (see the module doc)."""
FLANKS = 2
"""Candidates probed on each side of a confirmed answer, looking for a second flip."""

_OLD, _NEW, _SKIP = "old", "new", "skip"


class _Stop(Exception):
    def __init__(self, result: BisectResult[Any]) -> None:
        self.result = result


def bisect(
    candidates: Sequence[C],
    probe: ProbeFn,
    *,
    find_fix: bool = False,
    lone_end: bool = False,
    repeats: int = 1,
    confirm: int | bool = False,
    flanks: int = 0,
    state: BisectState | None = None,
    on_event: Callable[[Progress], None] | None = None,
    key: Callable[[C], str] | None = None,
) -> BisectResult[C]:
    """Find where `probe` changes its answer along `candidates` (oldest first).

    The oldest candidate is the good end (bad with `find_fix`) and the newest the bad end
    (good with `find_fix`); with `lone_end` only the newest is an endpoint and the search
    steps backward from it. `key` names candidates in the state and the report and must be
    unique (default: the candidate's `key` attribute, else `str`). Raises BisectRefused
    when the endpoints do not allow an answer; returns a `flaky` result, never a boundary,
    when repeated probes disagree. `confirm` fresh runs per side of the answer (True:
    CONFIRM_RUNS; False / 0: none); `flanks` candidates per side probed afterwards for a
    second flip (0, the default here: none; the CLI's default is FLANKS).
    """
    runs = CONFIRM_RUNS if confirm is True else int(confirm)
    if runs < 0 or flanks < 0:
        raise BisectError(f"confirm and flanks must be >= 0, got {runs} and {flanks}")
    search = _Search(list(candidates), probe, find_fix=find_fix, repeats=repeats,
                     confirm=runs, flanks=flanks, state=state or BisectState(), on_event=on_event,
                     key=key or candidate_key)
    try:
        return search.run(lone_end)
    except _Stop as stop:
        if stop.result.kind == "refused":
            raise BisectRefused(stop.result) from None
        return stop.result


class _Search(Generic[C]):
    def __init__(self, candidates: list[C], probe: ProbeFn, *, find_fix: bool, repeats: int,
                 confirm: int, flanks: int, state: BisectState, on_event: Callable[[Progress], None] | None,
                 key: Callable[[C], str]) -> None:
        if repeats < 1:
            raise BisectError(f"repeats must be at least 1, got {repeats}")
        self.candidates = candidates
        self.keys = [key(c) for c in candidates]
        duplicates = sorted(k for k, count in Counter(self.keys).items() if count > 1)
        if duplicates:
            raise BisectError(f"candidate keys must be unique; repeated: {', '.join(duplicates)}")
        self.probe = probe
        self.mode: Literal["regression", "fix"] = "fix" if find_fix else "regression"
        self.new_outcome = "good" if find_fix else "bad"
        self.repeats = repeats
        self.confirm = confirm
        self.flanks = flanks
        self.state = state
        self.on_event = on_event
        self.records: dict[int, ProbeRecord[C]] = {}
        self.about = 0

    # -- the search -------------------------------------------------------------------

    def run(self, lone_end: bool) -> BisectResult[C]:
        n = len(self.candidates)
        if n < 2:
            self._refuse(f"need at least two candidates to bisect, got {n}")
        newest = n - 1
        if lone_end:
            self.about = 2 * _log2(n) + 2
            self._verify_end(newest, self.new_outcome, _NEW)
            lo, hi = self._search_back(newest)
        else:
            self.about = _log2(n - 1) + 2
            self._verify_ends(0, newest)
            lo, hi = 0, newest
        lo, hi = self._narrow(lo, hi)
        if self.confirm:
            self.about = len(self.records)
            for index in (lo, hi):
                self._observe(index, "confirm", runs=self.repeats + self.confirm)
        if hi == lo + 1:
            self._probe_flanks(lo, hi)
        return self._result(
            "boundary" if hi == lo + 1 else "range",
            last_old=self.candidates[lo], first_new=self.candidates[hi],
            range=self.candidates[lo + 1:hi + 1])

    def _verify_ends(self, old: int, new: int) -> None:
        new_state = self._observe(new, "verify")
        old_state = self._observe(old, "verify")
        good, bad = (self._label(new), self._label(old)) if self.mode == "fix" else (
            self._label(old), self._label(new))
        if _SKIP in (new_state, old_state):
            which = new if new_state == _SKIP else old
            name = self.new_outcome if which == new else self._old_outcome
            self._refuse(f"{name} end {self._label(which)} could not be probed "
                         f"({self._why_skip(which)}): pick another endpoint")
        if new_state == old_state:
            said = self.new_outcome if new_state == _NEW else self._old_outcome
            self._refuse(f"the endpoints do not differ: good end {good} and bad end {bad} "
                         f"both probe {said}; check the test, or pick other endpoints")
        if new_state == _OLD:
            hint = "without --find-fix" if self.mode == "fix" else "with --find-fix"
            self._refuse(f"the endpoints are swapped: good end {good} probes bad and bad end "
                         f"{bad} probes good; to find where it changed that way, rerun {hint}")

    def _verify_end(self, index: int, name: str, expected: str) -> None:
        seen = self._observe(index, "verify")
        if seen == _SKIP:
            self._refuse(f"{name} end {self._label(index)} could not be probed "
                         f"({self._why_skip(index)}): pick another endpoint")
        if seen != expected:
            self._refuse(f"{name} end {self._label(index)} probes {self._outcome_name(seen)}: "
                         "nothing to bisect")

    def _search_back(self, newest: int) -> tuple[int, int]:
        """Step back 1, 2, 4, ... candidates from the new end until one is in the old state.

        A skipped candidate is replaced by the nearest older one not known to be skipped,
        else the nearest newer one below the oldest new state seen.
        """
        hi, distance = newest, 1
        while True:
            target = min(max(newest - distance, 0), hi - 1)
            index = next((i for i in [*range(target, -1, -1), *range(target + 1, hi)]
                          if not self._known_skip(i)), None)
            if index is None:
                self._refuse(
                    f"no {self._old_outcome} candidate back to the oldest, {self._label(0)}: "
                    f"every candidate probed {self.new_outcome} or skip; give more history or "
                    "an explicit endpoint")
            self.about = len(self.records) + 2 * _log2(index + 1) + 1
            seen = self._observe(index, "search-back")
            if seen == _OLD:
                return index, hi
            if seen == _NEW:
                hi, distance = index, distance * 2

    def _narrow(self, lo: int, hi: int) -> tuple[int, int]:
        """Binary search between a known old `lo` and a known new `hi`, around skips."""
        while True:
            index = self._pick(lo, hi)
            if index is None:
                return lo, hi
            self.about = len(self.records) + _log2(hi - lo)
            seen = self._observe(index, "bisect")
            if seen == _OLD:
                lo = index
            elif seen == _NEW:
                hi = index

    def _pick(self, lo: int, hi: int) -> int | None:
        """The candidate nearest the middle of (lo, hi) not known to be skipped."""
        middle = (lo + hi) // 2
        for offset in range(hi - lo):
            for index in (middle + offset, middle - offset) if offset else (middle,):
                if lo < index < hi and not self._known_skip(index):
                    return index
        return None

    def _probe_flanks(self, lo: int, hi: int) -> None:
        """Look for a second flip on each side of the pair (see the module doc): a flank in
        the other side's state, confirmed like the pair, ends with `came-and-went`."""
        sides = ((_OLD, range(0, lo), lo - 1), (_NEW, range(hi + 1, len(self.candidates)), hi + 1))
        for expected, side, neighbour in sides:
            for index in self._flank_picks(side, neighbour):
                self.about = len(self.records) + 1
                seen = self._observe(index, "flank")
                if seen in (_SKIP, expected):
                    continue
                self._observe(index, "flank", runs=self.repeats + max(self.confirm, 1))
                record = self.records[index]
                raise _Stop(self._result(
                    "came-and-went", last_old=self.candidates[lo], first_new=self.candidates[hi],
                    range=self.candidates[lo + 1:hi + 1], flank=record,
                    reason=f"{self._label(index)}, on the {self._outcome_name(expected)} side of the "
                           f"change found ({self._label(lo)} .. {self._label(hi)}), answered "
                           f"{', '.join(record.outcomes)}: the behaviour flipped more than once, so "
                           f"this search's answer may not be the change you look for (it "
                           f"{ONE_FLIP.format(old=self._old_outcome, new=self.new_outcome)}); "
                           f"bisect again between "
                           f"{self._label(index)} and the change found"))

    def _flank_picks(self, side: range, neighbour: int) -> list[int]:
        """Up to `flanks` unprobed candidates of `side`: the pair's neighbour, then the
        middle of the widest stretch between probed candidates (a flip the search stepped
        over lies in such a stretch)."""
        picks: list[int] = []
        if not self.flanks or not len(side):
            return picks
        if neighbour in side and neighbour not in self.records:
            picks.append(neighbour)
        while len(picks) < self.flanks:
            fences = sorted({side.start - 1, side.stop, *picks,
                             *(i for i in self.records if i in side)})
            gaps = [(b - a, a, b) for a, b in zip(fences, fences[1:]) if b - a > 1]
            if not gaps:
                break
            _, a, b = max(gaps)
            picks.append((a + b) // 2)
        return picks

    def _why_skip(self, index: int) -> str:
        """`skip`, with the first line of what the probe said about it."""
        runs = self.records[index].runs
        said = runs[-1].detail.strip().splitlines()[0] if runs and runs[-1].detail.strip() else ""
        return f"skip: {said}" if said else "skip"

    def _known_skip(self, index: int) -> bool:
        record = self.records.get(index)
        return record is not None and record.outcome == "skip"

    # -- probing ----------------------------------------------------------------------

    def _observe(self, index: int, phase: str, runs: int | None = None) -> str:
        """Probe candidate `index` until it has `runs` (default `repeats`) runs; old, new or
        skip."""
        key = self.keys[index]
        record = self.records.get(index)
        if record is None:
            record = self.records[index] = ProbeRecord(key, self.candidates[index], index, phase)
            for run in self.state.runs(key):
                if run.reason == "infra":
                    continue
                record.runs.append(run)
                self._emit(record, run)
        first_phase = record.phase
        record.phase = phase  # the events say why this run happens; the record keeps its first
        try:
            self._probe_until(record, key, runs or self.repeats)
        finally:
            record.phase = first_phase
        if record.outcome == "flaky":
            raise _Stop(self._result(
                "flaky", flaky=record,
                reason=f"{self._label(index)} is flaky: {len(record.runs)} runs answered "
                       f"{', '.join(record.outcomes)}; no boundary can be trusted"))
        if record.outcome == "skip":
            return _SKIP
        return _NEW if record.outcome == self.new_outcome else _OLD

    def _probe_until(self, record: ProbeRecord[C], key: str, runs: int) -> None:
        while record.outcome != "flaky" and len(record.runs) < runs:
            self._emit(record, None)
            started = time.monotonic()
            answer = self.probe(record.candidate)
            seconds = time.monotonic() - started
            if not isinstance(answer, ProbeOutcome):
                answer = ProbeOutcome(answer)  # type: ignore[arg-type]
            run = ProbeRun(answer.outcome, round(seconds, 3), answer.cached, answer.detail,
                           answer.setup_seconds, reason=answer.reason)
            record.runs.append(run)
            self.state.record(key, run)
            self._emit(record, run)

    def _emit(self, record: ProbeRecord[C], run: ProbeRun | None) -> None:
        if self.on_event is None:
            return
        step = len(self.records)
        number = len(record.runs) + (1 if run is None else 0)
        self.on_event(Progress(
            step=step, about=max(self.about, step), phase=record.phase, candidate=record.key,
            run=number, repeats=self.repeats,
            outcome=None if run is None else run.outcome,
            seconds=None if run is None else run.seconds,
            cached=None if run is None else run.cached,
            resumed=False if run is None else run.resumed))

    # -- answers ----------------------------------------------------------------------

    def _result(self, kind: Kind, **fields: Any) -> BisectResult[C]:
        probes = list(self.records.values())
        return BisectResult(kind=kind, mode=self.mode, candidates=len(self.candidates),
                            probes=probes, repeats=self.repeats, confirm=self.confirm, **fields)

    def _refuse(self, reason: str) -> NoReturn:
        raise _Stop(self._result("refused", reason=reason))

    @property
    def _old_outcome(self) -> str:
        return "bad" if self.mode == "fix" else "good"

    def _outcome_name(self, seen: str) -> str:
        return {_NEW: self.new_outcome, _OLD: self._old_outcome}.get(seen, seen)

    def _label(self, index: int) -> str:
        return self.keys[index]


def _log2(n: int) -> int:
    """ceil(log2 n) for n >= 1: the probes a binary search over a gap of n needs."""
    return (n - 1).bit_length()
