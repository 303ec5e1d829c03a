"""Verdicts against history: the rules of distci.judge.verdicts, on histories written as data."""

from __future__ import annotations

import random

import pytest

from distci.judge.verdicts import Observation, RunHistory, judge_history, worst

T = "suites/test_tp.py::test_tp_loss"


def hist(*nights: tuple[str, ...] | str, env_prefix: str = "torch-", test: str = T) -> list[RunHistory]:
    """One run per night; each night is an outcome string like `passed`, `failed`,
    `failed/infra`, `failed+passed` (first attempt + reruns), `failed!known-1`, or a
    tuple (outcome, env) to pin the environment."""
    runs = []
    for i, spec in enumerate(nights):
        outcome, env = spec if isinstance(spec, tuple) else (spec, f"{env_prefix}{i}")
        known = None
        if "!" in outcome:
            outcome, known = outcome.split("!")
        kind = None
        if "/" in outcome:
            outcome, kind = outcome.split("/")
        first, *reruns = outcome.split("+")
        if first != "passed" and kind is None and first != "skipped":
            kind = "assert"
        obs = Observation(test, first, kind, tuple(reruns), known)
        runs.append(RunHistory(f"run{i}", f"2026-03-{i + 1:02d}T02:00:00+00:00", env, {test: obs}))
    return runs


def verdicts(runs: list[RunHistory], baseline: list[RunHistory] = ()) -> list[str]:
    out = judge_history(runs, baseline)
    return [out[(r.run_id, T)].verdict for r in runs]


@pytest.mark.parametrize(
    "nights, expected",
    [
        (("passed", "failed"), ["pass", "regression"]),
        (("passed", "failed", "failed"), ["pass", "regression", "fail"]),
        (("failed", "failed"), ["fail", "fail"]),
        (("passed", "failed", "passed"), ["pass", "regression", "fixed"]),
        (("passed", "error/infra", "passed"), ["pass", "infra", "pass"]),
        (("failed", "error/infra"), ["fail", "infra"]),
        (("passed", "skipped", "failed"), ["pass", "skip", "regression"]),
        (("passed", "failed+passed", "passed"), ["pass", "flaky", "pass"]),
        (("passed", "passed!known-1"), ["pass", "fixed"]),
        (("passed", "failed!known-1", "passed"), ["pass", "xfail", "fixed"]),
    ],
)
def test_rules(nights: tuple[str, ...], expected: list[str]) -> None:
    assert verdicts(hist(*nights)) == expected


def test_infra_is_never_a_regression_and_does_not_hide_one() -> None:
    runs = hist("passed", "error/infra", "error/infra", "failed")
    got = judge_history(runs)
    assert [got[(r.run_id, T)].verdict for r in runs] == ["pass", "infra", "infra", "regression"]
    assert got[("run3", T)].compared_run == "run0"


def test_flaky_when_same_environment_gives_both_answers() -> None:
    same = hist(("passed", "env-a"), ("failed", "env-a"), ("passed", "env-a"))
    assert verdicts(same) == ["pass", "flaky", "flaky"]
    assert verdicts(hist(("passed", "env-a"), ("failed", "env-b"))) == ["pass", "regression"]


def test_flaky_results_are_not_history() -> None:
    """A flaky night says nothing about the code: the next red compares with the last green,
    and is flaky itself (the test is known-flaky) unless it fails on every rerun."""
    runs = hist("passed", "failed+passed", "failed+failed")
    got = judge_history(runs)
    assert [got[(r.run_id, T)].verdict for r in runs] == ["pass", "flaky", "regression"]
    assert got[("run2", T)].compared_run == "run0"
    assert verdicts(hist("passed", "failed+passed", "failed")) == ["pass", "flaky", "flaky"]


# The flaky window: histories of one test in one cell, as data. `passed`/`failed` on a new
# stack every night (a nightly cell) unless pinned to an env; `failed+failed` failed its
# rerun too; `failed+passed` passed on the rerun.
NIGHTLY_5050 = ("passed", "failed", "passed", "failed", "passed", "failed", "failed", "passed")


@pytest.mark.parametrize(
    "nights, expected",
    [
        # a 50/50 test on a nightly cell: the flips, not the changing stack, decide
        (NIGHTLY_5050, ["pass", "regression", "fixed", "flaky", "flaky", "flaky", "flaky", "flaky"]),
        # ... and once known-flaky, a failure on every rerun is still a failure
        (NIGHTLY_5050[:5] + ("failed+failed",), ["pass", "regression", "fixed", "flaky", "flaky", "regression"]),
        (NIGHTLY_5050[:6] + ("failed+failed",), ["pass", "regression", "fixed", "flaky", "flaky", "flaky", "fail"]),
        # a 50/50 test on a fixed stack never becomes a blocking `fail` by failing twice
        (tuple(("passed" if c == "P" else "failed", "env-a") for c in "PFFPFF"),
         ["pass", "flaky", "flaky", "flaky", "flaky", "flaky"]),
        # a fixed stack, failing every rerun although the same stack passed: blocking fail
        ((("passed", "env-a"), ("failed+failed", "env-a")), ["pass", "fail"]),
        # a rerun pass makes the test known-flaky for the window
        (("passed", "failed+passed", "passed", "failed"), ["pass", "flaky", "pass", "flaky"]),
        # one break and its fix are not flakiness
        (("passed", "passed", "failed", "failed", "passed"), ["pass", "pass", "regression", "fail", "fixed"]),
        # a real regression stays red night after night
        (("passed",) * 3 + ("failed",) * 4, ["pass"] * 3 + ["regression", "fail", "fail", "fail"]),
    ],
)
def test_flaky_window(nights: tuple, expected: list[str]) -> None:
    assert verdicts(hist(*nights)) == expected


def test_flaky_window_forgets() -> None:
    """Evidence older than FLAKY_WINDOW outcomes no longer makes a failure flaky."""
    from distci.judge.verdicts import FLAKY_WINDOW

    nights = ("passed", "failed+passed") + ("passed",) * FLAKY_WINDOW + ("failed",)
    assert verdicts(hist(*nights))[-1] == "regression"
    nights = ("passed", "failed+passed") + ("passed",) * (FLAKY_WINDOW - 2) + ("failed",)
    assert verdicts(hist(*nights))[-1] == "flaky"


def test_baseline_cell_judges_a_cell_without_history() -> None:
    base = hist("passed", "passed")
    candidate = [RunHistory("rc0", "2026-03-03T00:00:00+00:00", "rc", {T: Observation(T, "failed", "assert")})]
    got = judge_history(candidate, base)
    assert got[("rc0", T)].verdict == "regression"
    assert got[("rc0", T)].compared_run == "run1"
    base_red = hist("failed")
    fixed = [RunHistory("rc0", "2026-03-03T00:00:00+00:00", "rc", {T: Observation(T, "passed")})]
    assert judge_history(fixed, base_red)[("rc0", T)].verdict == "fixed"


def test_baseline_runs_after_the_run_do_not_count() -> None:
    late_base = [RunHistory("b0", "2026-04-01T00:00:00+00:00", "x", {T: Observation(T, "passed")})]
    rc = [RunHistory("rc0", "2026-03-03T00:00:00+00:00", "rc", {T: Observation(T, "failed", "assert")})]
    assert judge_history(rc, late_base)[("rc0", T)].verdict == "fail"


def test_history_order_not_arrival_order() -> None:
    runs = hist("passed", "failed", "failed", "passed", "error/infra", "failed")
    expected = judge_history(runs)
    shuffled = runs[:]
    random.Random(0).shuffle(shuffled)
    assert judge_history(shuffled) == expected


def test_worst_orders_by_severity() -> None:
    assert worst(["pass", "infra", "flaky"]) == "flaky"
    assert worst(["pass", "infra"]) == "infra"
    assert worst(["xfail", "fail", "regression"]) == "regression"
    assert worst([]) is None
