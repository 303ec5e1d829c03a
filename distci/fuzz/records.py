"""The fuzz generators' records: what one drawn case did (Outcome), a failure and the
smallest case that still fails its way (Find), a run's account (Report).

One owner for the configurations, programs and models engines: each draws its own kind
of case (a point of the scenario space, a Program, a model structure), and all three keep
the same account of it. `outcome_of` reads a case's Result the same way for all of them,
naming a near miss by the registry's one rule (distci.known_issues.Registry.near_misses).
The ops generator shrinks inside its sweeps and keeps its own (ops_command.OpsFind).
Pure: no process, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

FAILED = ("failed", "error")
NO_RESULT = "no result recorded (see pytest.log)"


@dataclass(frozen=True)
class Outcome:
    """What one case did (read off its Result)."""

    case: Any
    """What was drawn: a configuration point (dict), a Program, a model structure (dict)."""
    outcome: str
    signature: str | None = None
    seconds: float = 0.0
    known_issue: str | None = None
    message: str = ""
    test_id: str = ""
    kind: str | None = None
    """The Result's failure kind (assert, exception, timeout, hang, crash, ...)."""
    near_miss: str | None = None
    """The registered entries (comma-separated) whose bug this failure repeats outside their
    tests (Registry.near_misses): reported under their ids, never as new."""
    key: str = ""
    """The case's id (its test id's parameter): set by the batch runner, else by the engine."""

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED

    @property
    def first_divergence(self) -> str | None:
        """Where the parallel run first left the reference, as the cell side's entry wrote it
        (its line starting `first divergence`): the module and step (models, suites/localize.py),
        the action (programs); None where the entry does not localize (the configurations)."""
        return next((line.strip() for line in self.message.splitlines()
                     if line.strip().startswith("first divergence")), None)


def outcome_of(case: Any, key: str, result: Any, registry: Any = None, *, message_chars: int = 2000) -> Outcome:
    """A case's Result (None: none was recorded, `infra`) as an Outcome. A failure no entry
    explains is checked against the registry's near-miss rule here, for every generator."""
    if result is None:
        return Outcome(case, "infra", message=NO_RESULT, key=key)
    near = None
    if result.outcome in FAILED and not result.known_issue and registry is not None:
        near = ",".join(registry.near_misses(result.test_id, result.error_signature or "", result.message,
                                             result.stack)) or None
    return Outcome(case, result.outcome, result.error_signature, result.duration_s, result.known_issue,
                   result.message[:message_chars], result.test_id, result.failure_kind, near, key)


@dataclass
class Find:
    """A failure and its shrunk form; `steps` lists the accepted simplifications' ids in order."""

    found: Outcome
    shrunk: Outcome
    steps: list[str] = field(default_factory=list)
    complete: bool = True
    """False when shrinking stopped early: `shrunk` still fails the same way but may not be minimal."""
    stopped: str = ""
    """Why shrinking stopped early (empty when complete): which limit ran out."""
    seconds: float = 0.0
    """Wall time spent shrinking this find."""

    @property
    def near_miss(self) -> str | None:
        """The registered entries this find repeats outside their tests: it gets a quick shrink
        round only (its smaller face is worth a line, not a budget) and is never new."""
        return self.found.near_miss or self.shrunk.near_miss


@dataclass
class Report:
    tried: list[Outcome] = field(default_factory=list)
    """Every case run, in order (draws and shrink candidates)."""
    drawn: list[str] = field(default_factory=list)
    """The drawn cases' ids, in order: what a seed replays."""
    finds: list[Find] = field(default_factory=list)
    repeats: dict[str, str] = field(default_factory=dict)
    """A failing draw's id -> the find whose signature it repeats (not shrunk again)."""
    known: list[Outcome] = field(default_factory=list)
    """Failures the known-issues registry explained for their own test (not shrunk)."""
    slow: list[Outcome] = field(default_factory=list)
    """Cases that ran past the test timeout (kind `timeout`, ranks still computing, not
    stuck in a collective): not shrunk, since a smaller case is faster whatever the bug, and
    on a loaded machine a timeout is no bug's signature. A `hang` is shrunk."""
    exhausted: bool = False
    """The space held no more cases to draw."""
    shrink_s: float = 0.0
    """Wall time spent shrinking, all finds together."""

    def file(self, outcome: Outcome) -> str | None:
        """Files a failure no run shrinks: a timeout in `slow`, one the registry explained in
        `known`; returns which ("slow", "known"), or None for a failure that is a find. Every
        engine and a `--replay` file through here, so their summaries count alike."""
        if outcome.kind == "timeout":
            self.slow.append(outcome)
            return "slow"
        if outcome.known_issue:
            self.known.append(outcome)
            return "known"
        return None

    def take(self, outcome: Outcome, log: Callable[[str], Any]) -> Find | None:
        """A failure drawn by an engine, accounted for and said in one line: filed (`file`), a
        repeat of a find of this run (same signature: not shrunk again), or a new Find, returned
        for the engine to shrink (a near miss's one quick round is the engine's to bound)."""
        filed = self.file(outcome)
        if filed:
            log(f"  timed out, not shrunk: {outcome.key}" if filed == "slow" else
                f"  known issue {outcome.known_issue}: {outcome.key}")
            return None
        repeated = next((f for f in self.finds if f.found.signature == outcome.signature), None)
        if repeated is not None:
            self.repeats[outcome.key] = repeated.found.key
            return None
        find = Find(outcome, outcome)
        self.finds.append(find)
        if find.near_miss:
            log(f"  near miss of {find.near_miss}: {outcome.key} (its signature names that bug; one shrink round)")
        return find

    @classmethod
    def of_replay(cls, tried: list[Outcome], log: Callable[[str], Any]) -> "Report":
        """A `--replay`'s report: its failures accounted for as a run's draws are (`take`), left
        unshrunk, so the summary's counts, the exit code and report.json's finds agree (a replayed
        near miss is counted as one and is never new)."""
        report = cls(tried=list(tried), drawn=[o.key for o in tried])
        for outcome in tried:
            if outcome.failed:
                report.take(outcome, log)
        return report

    @property
    def near_misses(self) -> list[Find]:
        return [f for f in self.finds if f.near_miss]

    @property
    def new(self) -> list[Find]:
        """Finds no registered entry explains, even as a near miss: what exits 1 and gets filed."""
        return [f for f in self.finds if not f.near_miss and not f.shrunk.known_issue]
