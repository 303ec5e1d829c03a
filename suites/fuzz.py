"""The fuzzer's engine: draw configurations, run them in batches, shrink what fails.

Pure: it never starts a process. `run_batch(points) -> outcomes` is given by the caller
(distci's `fuzz` command runs a batch as one pytest session of suites/fuzz_entry.py on
the cell's rank pool; the tests give a fake). A failure is shrunk while the SAME failure
signature (the Result's `error_signature`) persists, to a point where every one-step
simplification (an axis back to its default, a size halved toward it) passes or fails
otherwise: no axis stays off its default unless the failure needs it.

Why an own engine and not Hypothesis: Hypothesis shrinks its choice sequence, not "axes
back to their defaults", calls the test synchronously one example at a time (a batch of
candidates in one pytest session on the rank pool is what makes shrinking affordable:
a pool start costs more than an eager run), keeps state in an example database, and its
draws and shrink order are documented to change between its releases. What we need is
small: a seeded stream (random.Random with a string seed: the same on every platform and
Python, independent of PYTHONHASHSEED), a pairwise-coverage bias (suites/space.Drawer),
and a greedy shrinker over named axes, all three deterministic given the seed, the space
and the outcomes, which is what makes a night's find replay.

Each shrink round runs every one-step simplification of the current point as one batch;
when two or more keep the signature, their combination (and its own simplifications)
run speculatively in the next batch, so a point with k extra axes shrinks in about
log2(k) + 2 batches instead of k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .space import Drawer, Space, key, smaller

FAILED = ("failed", "error")
ENTRY_TEST = "suites/fuzz_entry.py"
CONFIGS_ENV = "DISTCI_FUZZ_CONFIGS"
"""A JSON file: the list of points one batch runs (suites/fuzz_entry.py reads it)."""
CONFIG_ENV = "DISTCI_FUZZ_CONFIG"
"""Inline JSON: one point (axes at their defaults left out), for a repro."""


@dataclass(frozen=True)
class Outcome:
    """What one configuration did (read off its Result)."""

    point: dict[str, Any]
    outcome: str
    signature: str | None = None
    seconds: float = 0.0
    known_issue: str | None = None
    message: str = ""
    test_id: str = ""

    @property
    def key(self) -> str:
        return key(self.point)

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED


@dataclass
class Find:
    """A failure and its shrunk form; `steps` lists the accepted simplifications in order."""

    found: Outcome
    shrunk: Outcome
    steps: list[str] = field(default_factory=list)
    complete: bool = True
    """False when the budget ran out mid-shrink: `shrunk` still fails the same way but may not be minimal."""


@dataclass
class Report:
    tried: list[Outcome] = field(default_factory=list)
    """Every configuration run, in order (draws and shrink candidates)."""
    drawn: list[str] = field(default_factory=list)
    """The drawn configurations' ids, in order: what a seed replays."""
    finds: list[Find] = field(default_factory=list)
    repeats: dict[str, str] = field(default_factory=dict)
    """A failing draw's id -> the find whose signature it repeats (not shrunk again)."""
    known: list[Outcome] = field(default_factory=list)
    """Failures the known-issues registry explained (not shrunk)."""
    exhausted: bool = False


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

    def _fits(self) -> int:
        """Configurations the time left holds at the mean time per configuration so far
        (at least one): a batch started near the end should not overrun by a whole batch."""
        done = [o.seconds for o in self.report.tried]
        if not done:
            return self.batch_size
        mean = max(sum(done) / len(done), 1e-3)
        return max(1, int(self.left_s() // mean))

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
                self.report.drawn.append(key(point))
            if not points:
                break
            for outcome in self._run(points):
                if outcome.failed:
                    self._found(outcome)
            if self.report.exhausted:
                break
        return self.report

    def _run(self, points: list[dict[str, Any]]) -> list[Outcome]:
        todo = [p for p in points if key(p) not in self.cache]
        if todo:
            for outcome in self.run_batch(todo):
                self.cache[outcome.key] = outcome
                self.report.tried.append(outcome)
        missing = [key(p) for p in points if key(p) not in self.cache]
        if missing:
            raise RuntimeError(f"the batch runner returned no outcome for {', '.join(missing)}")
        return [self.cache[key(p)] for p in points]

    def _found(self, outcome: Outcome) -> None:
        if outcome.known_issue:
            self.report.known.append(outcome)
            self.log(f"  known issue {outcome.known_issue}: {outcome.key}")
            return
        for find in self.report.finds:
            if find.found.signature == outcome.signature:
                self.report.repeats[outcome.key] = find.found.key
                return
        find = Find(outcome, outcome)
        self.report.finds.append(find)
        if self.shrink:
            self.log(f"  shrinking {outcome.key} ({outcome.signature})")
            self._shrink(find)

    def _keeps(self, o: Outcome, signature: str | None) -> bool:
        return o.failed and o.signature == signature

    def _shrink(self, find: Find) -> None:
        signature = find.found.signature
        current = find.found
        while True:
            if self.left_s() <= 0:
                find.complete = False
                break
            candidates = smaller(self.space, current.point)
            if not candidates:
                break
            outcomes = self._run(candidates)
            keepers = [o for o in outcomes if self._keeps(o, signature)]
            if not keepers:
                break
            nxt = keepers[0]
            if len(keepers) > 1 and self.left_s() > 0:
                combo = _combine(self.space, current.point, [k.point for k in keepers])
                if combo is not None and key(combo) not in self.cache:
                    # speculative: the combination and its own simplifications in one batch
                    self._run([combo, *[c for c in smaller(self.space, combo)]])
                if combo is not None and self._keeps(self.cache[key(combo)], signature):
                    nxt = self.cache[key(combo)]
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
