"""Verdicts: what an outcome means against history and known issues.

An outcome (distci.results) says what happened in one run. A verdict says what a
person should do about it, so it needs history: the same failure is a `regression`
the first night after the test was green, a plain `fail` the nights after, `xfail`
once the known-issues registry names it, `infra` when the environment never came
up (rule 4: never a regression, never a red cell), `flaky` when the same environment
gave both answers.

Flakiness is judged over a window of the cell's runs, not only the previous one: the
nightly's stack changes every night, so "same environment" alone would call every flip
of a 50/50 test a `regression`. A test is known-flaky in a cell when, over its last
FLAKY_WINDOW outcomes there (whatever the stack), it flipped between pass and fail at
least FLAKY_FLIPS times, or passed on a rerun after failing, or passed with exactly this
stack. A known-flaky failure is `flaky`, never `regression` or a blocking `fail`,
unless it failed on every rerun in this run: a test that fails every time it is tried is
failing, whatever its past.

This module is pure: it sees runs as `RunHistory` values and returns `Verdict`s. What
judging carries from run to run is a `CellMemory`, so the store judges a landed run from the
state before it (distci.judge.rejudge) and can recompute all verdicts at any time: a run
that arrives late (an artifact uploaded after the next night's) still gets the verdicts it
would have had in order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import AbstractSet as Set, Iterable, Sequence

from distci.stack import ENV_KEYS, Stack

VERDICTS = ("pass", "regression", "fail", "xfail", "fixed", "flaky", "infra", "skip")

BLOCKING = frozenset({"regression", "fail"})
"""Verdicts that block a release gate and turn a cell red."""

SEVERITY = {v: i for i, v in enumerate(("regression", "fail", "flaky", "infra", "xfail", "fixed", "pass", "skip"))}
"""Lower is worse: a group of results (a suite in a cell) shows its worst verdict."""

_FAILED = ("failed", "error")

FLAKY_WINDOW = 10
"""How many earlier outcomes of a test in a cell the flakiness judgement looks at."""

FLAKY_FLIPS = 3
"""Pass<->fail flips (the current outcome included) that make a test known-flaky. Two
flips are a break and its fix (P P F P); three are no longer a story about one change."""


def worst(verdicts: Iterable[str]) -> str | None:
    """The most severe verdict of a group, or None for an empty group."""
    return min(verdicts, key=lambda v: SEVERITY.get(v, len(SEVERITY)), default=None)


def env_key(stack: Stack) -> str:
    """A fingerprint of the environment a stack describes (see ENV_KEYS)."""
    return json.dumps({k: stack.get(k) for k in ENV_KEYS if stack.get(k) is not None}, sort_keys=True, default=str)


@dataclass(frozen=True)
class Observation:
    """One test's outcome in one run, reduced to what verdicts depend on."""

    test_id: str
    outcome: str
    failure_kind: str | None = None
    rerun_outcomes: tuple[str, ...] = ()
    known_issue: str | None = None

    @property
    def is_infra(self) -> bool:
        return self.failure_kind == "infra"

    @property
    def is_flaky(self) -> bool:
        """Mixed outcomes across the first attempt and its reruns in one environment."""
        if not self.rerun_outcomes:  # one try cannot disagree with itself
            return False
        seen = {o for o in (self.outcome, *self.rerun_outcomes) if o != "skipped"}
        return "passed" in seen and bool(seen & set(_FAILED))

    @property
    def failed(self) -> bool:
        return self.outcome in _FAILED

    @property
    def failed_every_rerun(self) -> bool:
        """Failed the first attempt and every rerun (there was at least one rerun)."""
        return self.failed and bool(self.rerun_outcomes) and all(o in _FAILED for o in self.rerun_outcomes)

    @property
    def informative(self) -> bool:
        """Whether this outcome says something about the code: not skipped, infra or flaky."""
        return self.outcome != "skipped" and not self.is_infra and not self.is_flaky


@dataclass
class RunHistory:
    """One run of a cell as verdicts see it."""

    run_id: str
    started_at: str
    env: str = ""
    results: dict[str, Observation] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    compared_run: str | None = None
    reason: str = ""


_Seen = tuple[RunHistory, Observation]


def flaky_evidence(obs: Observation, env: str, window: Sequence[_Seen]) -> str | None:
    """Why the test is known-flaky in this cell, or None (see the module doc).

    `window` is the test's earlier outcomes in the cell, oldest first (skips and infra
    left out, in-run flaky ones kept): the last FLAKY_WINDOW of them count.
    """
    seen = list(window)[-FLAKY_WINDOW:]
    for run, o in reversed(seen):
        if o.is_flaky:
            return f"passed on a rerun after failing in run {run.run_id}"
    if obs.failed:
        same = next((run for run, o in reversed(seen) if run.env == env and o.outcome == "passed"), None)
        if same is not None:
            return f"passed in run {same.run_id} with the same stack"
    marks = [o.outcome == "passed" for _, o in seen if not o.is_flaky] + [obs.outcome == "passed"]
    flips = sum(a != b for a, b in zip(marks, marks[1:]))
    if flips >= FLAKY_FLIPS:
        return f"flipped between pass and fail {flips} times in its last {len(marks)} runs in this cell"
    return None


def judge(
    obs: Observation, env: str, previous: _Seen | None, baseline: _Seen | None, window: Sequence[_Seen] = ()
) -> Verdict:
    """The verdict of one outcome.

    `previous` is the last informative outcome of the same test in an earlier run of the
    same cell; `baseline` the latest informative one in the declared baseline cell, used
    only when the cell has no history of its own for the test (a new cell, a release
    candidate judged against the release it replaces); `window` the test's earlier
    outcomes in the cell, for flakiness (flaky_evidence).
    """
    if obs.outcome == "skipped":
        return Verdict("skip")
    if obs.is_infra:
        return Verdict("infra", reason="the environment, image or device failed")
    if obs.is_flaky:
        tries = ", ".join((obs.outcome, *obs.rerun_outcomes))
        return Verdict("flaky", reason=f"mixed outcomes across reruns: {tries}")

    ref, where = (previous, "the previous run") if previous else (baseline, "the baseline cell")
    ref_run, ref_obs = ref if ref else (None, None)
    same_env = ref_run is not None and previous is not None and ref_run.env == env
    ref_id = ref_run.run_id if ref_run else None

    if obs.outcome == "passed":
        if obs.known_issue:
            return Verdict("fixed", reason=f"XPASS: known issue {obs.known_issue} did not reproduce")
        if ref_obs is not None and ref_obs.failed:
            if same_env:
                return Verdict("flaky", ref_id, f"failed in run {ref_id} with the same stack")
            evidence = flaky_evidence(obs, env, window)
            if evidence:
                return Verdict("flaky", ref_id, f"known flaky in this cell: {evidence}")
            return Verdict("fixed", ref_id, f"failed in {where} ({ref_id})")
        return Verdict("pass", ref_id)

    if obs.known_issue:
        return Verdict("xfail", reason=f"known issue {obs.known_issue}")
    if obs.failed_every_rerun:
        tries = len(obs.rerun_outcomes) + 1
        if ref_obs is not None and ref_obs.outcome == "passed":
            if same_env:
                return Verdict("fail", ref_id, f"failed all {tries} tries; run {ref_id} passed with the same stack")
            return Verdict("regression", ref_id, f"failed all {tries} tries; passed in {where} ({ref_id})")
    else:
        evidence = flaky_evidence(obs, env, window)
        if evidence:
            return Verdict("flaky", ref_id, f"known flaky in this cell: {evidence}")
    if ref_obs is not None and ref_obs.outcome == "passed":
        return Verdict("regression", ref_id, f"passed in {where} ({ref_id})")
    if ref_obs is not None:
        return Verdict("fail", ref_run.run_id, f"also failing in {where} ({ref_run.run_id})")
    return Verdict("fail", reason="no green history")


def _order(runs: Iterable[RunHistory]) -> list[RunHistory]:
    return sorted(runs, key=lambda r: (r.started_at, r.run_id))


@dataclass
class CellMemory:
    """What judging carries through a cell's runs, per test: its last informative outcome
    and its last FLAKY_WINDOW outcomes that were neither skipped nor infra. A test absent
    here has no history yet; the store keeps one per cell between ingests
    (distci.judge.rejudge), so tonight's run is judged without reading the year."""

    last: dict[str, _Seen] = field(default_factory=dict)
    window: dict[str, list[_Seen]] = field(default_factory=dict)

    def take(self, run: RunHistory, test_id: str, obs: Observation) -> None:
        """One more outcome of a test, after every one taken before it."""
        if obs.informative:
            self.last[test_id] = (run, obs)
        if obs.outcome != "skipped" and not obs.is_infra:
            seen = self.window.setdefault(test_id, [])
            seen.append((run, obs))
            del seen[:-FLAKY_WINDOW]


def judge_history(
    runs: Sequence[RunHistory], baseline_runs: Sequence[RunHistory] = (), judged: Set[str] | None = None,
    state: CellMemory | None = None,
) -> dict[tuple[str, str], Verdict]:
    """Verdicts for every result of a cell's runs, keyed by (run_id, test_id).

    Runs are judged in history order (started_at, then run id) whatever order they came
    in. For each run, the baseline is what the baseline cell's runs said up to that
    run's start. With `judged`, only those runs get verdicts: the others are history that
    the judged ones are compared with. `state` is the cell's state before the first of
    `runs` (default: no history); it is left as it stands after the last.
    """
    verdicts: dict[tuple[str, str], Verdict] = {}
    state = state if state is not None else CellMemory()
    last, window = state.last, state.window
    base_last: dict[str, _Seen] = {}
    base = _order(baseline_runs)
    b = 0
    for run in _order(runs):
        while b < len(base) and base[b].started_at <= run.started_at:
            for test_id, obs in base[b].results.items():
                if obs.informative:
                    base_last[test_id] = (base[b], obs)
            b += 1
        if judged is None or run.run_id in judged:
            for test_id, obs in run.results.items():
                verdicts[(run.run_id, test_id)] = judge(
                    obs, run.env, last.get(test_id), base_last.get(test_id), window.get(test_id, ())
                )
        for test_id, obs in run.results.items():
            state.take(run, test_id, obs)
    return verdicts
