"""The answer of a bisect and its parts: what a probe returns, every run of a candidate,
the result, the progress events. The engine (engine.py) makes them; the report, the
modes and the store read them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Literal, TypeVar, Union

from distci.bisect.state import BisectError, ProbeRun

C = TypeVar("C")
Outcome = Literal["good", "bad", "skip"]
Kind = Literal["boundary", "range", "flaky", "refused", "came-and-went"]

ONE_FLIP = ("assumes one flip: every candidate before the change answers {old}, every one "
            "from it on {new}")


@dataclass
class ProbeOutcome:
    """What a probe may return instead of a bare outcome string, to say more."""

    outcome: Outcome
    cached: bool | None = None
    detail: str = ""
    setup_seconds: float | None = None
    reason: str = ""


ProbeFn = Callable[[Any], Union[str, ProbeOutcome]]


@dataclass
class ProbeRecord(Generic[C]):
    """Every run of the probe on one candidate, in the order they happened."""

    key: str
    candidate: C
    index: int
    phase: str
    runs: list[ProbeRun] = field(default_factory=list)

    @property
    def outcomes(self) -> list[str]:
        return [run.outcome for run in self.runs]

    @property
    def outcome(self) -> str:
        """The agreed outcome, `flaky` when the runs disagree, `none` before any run."""
        seen = set(self.outcomes)
        return seen.pop() if len(seen) == 1 else "flaky" if seen else "none"

    @property
    def seconds(self) -> float:
        return sum(run.seconds for run in self.runs)

    @property
    def cached(self) -> bool | None:
        """Whether the first run found its environment warm (None: the probe did not say)."""
        return self.runs[0].cached if self.runs else None

    @property
    def resumed(self) -> bool:
        return bool(self.runs) and all(run.resumed for run in self.runs)


@dataclass
class BisectResult(Generic[C]):
    """The answer, with every probe that led to it.

    `last_old` / `first_new` bracket the change: for a regression the last good and the
    first bad candidate, with `find_fix` the last bad and the first good. `range` is what
    may hold the change: `[first_new]` for a boundary, the skipped candidates between the
    two plus `first_new` for a range, empty otherwise.
    """

    kind: Kind
    mode: Literal["regression", "fix"]
    candidates: int
    last_old: C | None = None
    first_new: C | None = None
    range: list[C] = field(default_factory=list)
    probes: list[ProbeRecord[C]] = field(default_factory=list)
    flaky: ProbeRecord[C] | None = None
    reason: str = ""
    repeats: int = 1
    confirm: int = 0
    flank: ProbeRecord[C] | None = None
    """came-and-went: the candidate that answered the other side's state."""

    @property
    def assumption(self) -> str:
        """The one-flip assumption, in this search's words (good/bad or bad/good)."""
        old, new = ("good", "bad") if self.mode == "regression" else ("bad", "good")
        return ONE_FLIP.format(old=old, new=new)

    @property
    def reasons(self) -> dict[str, int]:
        """Probe runs by reason (timeout, infra, native), this session's and resumed."""
        counted = Counter(run.reason for record in self.probes for run in record.runs if run.reason)
        return dict(sorted(counted.items()))

    @property
    def first_bad(self) -> C | None:
        return self.first_new if self.mode == "regression" else None

    @property
    def last_good(self) -> C | None:
        return self.last_old if self.mode == "regression" else None

    @property
    def first_good(self) -> C | None:
        return self.first_new if self.mode == "fix" else None

    @property
    def last_bad(self) -> C | None:
        return self.last_old if self.mode == "fix" else None

    @property
    def skipped(self) -> list[C]:
        return [record.candidate for record in self.probes if record.outcome == "skip"]


class BisectRefused(BisectError):
    """The bisect has no answer to look for; `.result` holds the probes that showed it."""

    def __init__(self, result: BisectResult[Any]) -> None:
        self.result = result
        super().__init__(result.reason)


@dataclass
class Progress:
    """One event: a probe run starting (`outcome` None) or finished.

    `step` counts distinct candidates probed so far, this one included; `about` is the
    expected total, recomputed as the range shrinks.
    """

    step: int
    about: int
    phase: str
    candidate: str
    run: int
    repeats: int
    outcome: str | None = None
    seconds: float | None = None
    cached: bool | None = None
    resumed: bool = False

    def __str__(self) -> str:
        head = f"step {self.step} of about {self.about} [{self.phase}] {self.candidate}"
        if self.repeats > 1:
            head += f" (run {self.run}/{self.repeats})"
        if self.outcome is None:
            return head + ": probing"
        how = "from state" if self.resumed else f"{self.seconds:.1f}s" + (
            "" if self.cached is None else (" warm" if self.cached else " cold"))
        return f"{head}: {self.outcome} ({how})"



def candidate_key(candidate: Any) -> str:
    """The name of a candidate in states and reports: its `key` attribute, else str()."""
    key = getattr(candidate, "key", None)
    return key if isinstance(key, str) else str(candidate)
