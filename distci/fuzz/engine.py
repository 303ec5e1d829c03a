"""The fuzzer's engine: draw configurations, run them in batches, shrink what fails.

Pure: it never starts a process. `run_batch(points) -> outcomes` is given by the caller
(distci's `fuzz` command runs each batch in the run's one pytest session of the cell side's
entry test, suites/fuzz_entry.py, on the cell's rank pool; the tests give a fake). The space (axes,
validity, ids) is distci.fuzz.space's over the cell side's declarations. A failure is shrunk while the SAME failure
signature (the Result's `error_signature`) persists, to a point where every one-step
simplification (an axis back to its default, a size halved toward it) passes or fails
otherwise: no axis stays off its default unless the failure needs it.

Why an own engine and not Hypothesis: Hypothesis shrinks its choice sequence, not "axes
back to their defaults", calls the test synchronously one example at a time (a batch of
candidates in one pytest session on the rank pool is what makes shrinking affordable:
a pool start costs more than an eager run), keeps state in an example database, and its
draws and shrink order are documented to change between its releases. What we need is
small: a seeded stream (random.Random with a string seed: the same on every platform and
Python, independent of PYTHONHASHSEED), a pairwise-coverage bias (distci.fuzz.space.Drawer),
and a greedy shrinker over named axes, all three deterministic given the seed, the space
and the outcomes, which is what makes a night's find replay.

A shrink round runs the one-step simplifications of the current point in batches of
`batch_size`, stopping at the first batch that holds one keeping the signature (first
improvement: a round never pays for simplifications it does not need); when two or more
keep it, their combination (and its own simplifications) run speculatively in the next
batch, so a point with k extra axes shrinks in about log2(k) + 2 batches instead of k.

Shrinking must not starve drawing (a night's first batch can hold four finds of 20-80 s
configurations): each find may shrink for at most `ShrinkLimits.per_find_s(budget)`
(default min(15 min, 25% of the budget)), all shrinking together for at most
`ShrinkLimits.total_share` of the budget (default half); a find whose limit ran out is
reported "shrunk so far, not minimal" with the point it reached. A failure with the
signature of a find of this run is a repeat (not shrunk); a registered entry's near miss
(distci.fuzz.records.Find.near_miss) gets one quick round only (`ShrinkLimits.quick_rounds`):
its smaller face is worth a line, not a budget. The records (Outcome, Find, Report) are
distci/fuzz/records.py's, shared with the other generators' engines.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from distci.fuzz.records import Find, Outcome, Report
from distci.fuzz.space import Drawer, Space, smaller

@dataclass(frozen=True)
class ShrinkLimits:
    """How much of a run's budget shrinking may take (see the module docstring)."""

    per_find_max_s: float = 900.0
    per_find_share: float = 0.25
    total_share: float = 0.5
    quick_rounds: int = 1

    def per_find_s(self, budget_s: float) -> float:
        return min(self.per_find_max_s, self.per_find_share * budget_s)


RunBatch = Callable[[list[dict[str, Any]]], list[Outcome]]
Log = Callable[[str], Any]


@dataclass
class Fuzzer:
    space: Space
    seed: str
    run_batch: RunBatch
    budget_s: float = 1800.0
    max_configs: int | None = None
    batch_size: int = 6
    shrink: bool = True
    log: Log = print
    clock: Callable[[], float] = time.monotonic
    cache: dict[str, Outcome] = field(default_factory=dict)
    limits: ShrinkLimits = field(default_factory=ShrinkLimits)

    def __post_init__(self) -> None:
        self.drawer = Drawer(self.space, self.seed)
        self.report = Report()
        self.started = self.clock()

    def left_s(self) -> float:
        return self.budget_s - (self.clock() - self.started)

    def _room(self) -> int | None:
        if self.max_configs is None:
            return None
        return self.max_configs - len(self.report.drawn)

    def _fits(self, left_s: float | None = None) -> int:
        """Configurations `left_s` (default: the budget's time left) holds at the mean time per
        configuration so far (at least one): a batch started near a limit should not overrun
        it by a whole batch."""
        done = [o.seconds for o in self.report.tried]
        if not done:
            return self.batch_size
        mean = max(sum(done) / len(done), 1e-3)
        return max(1, int((self.left_s() if left_s is None else left_s) // mean))

    def run(self) -> Report:
        """Draw and run batches until the budget (time or configurations) is spent."""
        while self.left_s() > 0 and (self._room() is None or self._room() > 0):
            size = min(self.batch_size, self._fits())
            if self._room() is not None:
                size = min(size, self._room())
            points = []
            for _ in range(size):
                point = self.drawer.draw()
                if point is None:
                    self.report.exhausted = True
                    break
                points.append(point)
                self.report.drawn.append(self.space.key(point))
            if not points:
                break
            for outcome in self._run(points):
                if outcome.failed:
                    self._found(outcome)
            if self.report.exhausted:
                break
        return self.report

    def _run(self, points: list[dict[str, Any]]) -> list[Outcome]:
        todo = [p for p in points if self.space.key(p) not in self.cache]
        if todo:
            for outcome in self.run_batch(todo):
                outcome = outcome if outcome.key else dataclasses.replace(outcome, key=self.space.key(outcome.case))
                self.cache[outcome.key] = outcome
                self.report.tried.append(outcome)
        missing = [self.space.key(p) for p in points if self.space.key(p) not in self.cache]
        if missing:
            raise RuntimeError(f"the batch runner returned no outcome for {', '.join(missing)}")
        return [self.cache[self.space.key(p)] for p in points]

    def _found(self, outcome: Outcome) -> None:
        find = self.report.take(outcome, self.log)
        if find is None or not self.shrink:
            return
        started = self.clock()
        try:
            self._shrink(find)
        finally:
            find.seconds = self.clock() - started
            self.report.shrink_s += find.seconds

    def _keeps(self, o: Outcome, signature: str | None) -> bool:
        return o.failed and o.signature == signature

    def _shrink_limit(self) -> tuple[float, str]:
        """(seconds this find may shrink, what that limit is called in the report)."""
        per_find = self.limits.per_find_s(self.budget_s)
        total_left = self.limits.total_share * self.budget_s - self.report.shrink_s
        return min((per_find, f"its shrink limit of {per_find:.0f} s"),
                   (total_left, f"the run's shrink share ({self.limits.total_share:.0%} of the budget)"),
                   (self.left_s(), "the budget"))

    def _shrink(self, find: Find) -> None:
        signature = find.found.signature
        current = find.found
        limit_s, limit_name = self._shrink_limit()
        start = self.clock()
        rounds = 0

        def left() -> float:
            return min(limit_s - (self.clock() - start), self.left_s())

        def stop(why: str) -> None:
            find.complete, find.stopped = False, why

        if find.near_miss:
            self.log(f"  {current.key} is a near miss of known issue {find.near_miss}: "
                     f"{self.limits.quick_rounds} quick shrink round(s)")
        else:
            self.log(f"  shrinking {current.key} ({signature}) for at most {max(limit_s, 0):.0f} s")
        while True:
            if left() <= 0:
                stop(f"{limit_name} ran out")
                break
            if find.near_miss and rounds >= self.limits.quick_rounds:
                stop(f"a near miss of {find.near_miss}: {self.limits.quick_rounds} quick round(s) only")
                break
            rounds += 1
            candidates = smaller(self.space, current.case)
            keepers: list[Outcome] = []
            tried_all, i = True, 0
            while i < len(candidates):
                if left() <= 0:
                    tried_all = False
                    break
                chunk = candidates[i:i + min(self.batch_size, self._fits(left()))]
                i += len(chunk)
                keepers = [o for o in self._run(chunk) if self._keeps(o, signature)]
                if keepers:
                    break
            if not keepers:
                if not tried_all:
                    stop(f"{limit_name} ran out")
                break
            nxt = keepers[0]
            if len(keepers) > 1 and left() > 0:
                combo = _combine(self.space, current.case, [k.case for k in keepers])
                if combo is not None and self.space.key(combo) not in self.cache:
                    # speculative: the combination and its own simplifications in one batch
                    self._run([combo, *smaller(self.space, combo)][:max(1, self._fits(left()))])
                held = self.cache.get(self.space.key(combo)) if combo is not None else None
                if held is not None and self._keeps(held, signature):
                    nxt = held
            find.steps.append(nxt.key)
            self.log(f"  shrunk to {nxt.key}")
            current = nxt
        find.shrunk = current


def _combine(space: Space, base: dict[str, Any], points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """`base` with every axis that any of `points` changed set as that point set it (first wins)."""
    merged = dict(space.complete(base))
    for p in points:
        for name, value in space.complete(p).items():
            if value != base[name] and merged[name] == base[name]:
                merged[name] = value
    return merged if space.valid(merged) else None
