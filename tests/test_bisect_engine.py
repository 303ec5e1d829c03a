"""Properties of the bisect engine, with plain functions as probes.

Candidates are the integers 0..N-1 (oldest first). An oracle knows the true boundary B:
for a regression, candidates below B are good and from B on bad. Probe counts are the
number of DISTINCT candidates probed, which is what a bisect costs in environments.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from distci.bisect import (
    BisectError,
    BisectRefused,
    BisectState,
    ProbeOutcome,
    bisect,
)
from distci.bisect.report import format_result, result_to_dict, write_report


def log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


class Oracle:
    """A monotone oracle with optional skipped candidates; counts its calls."""

    def __init__(self, boundary: int, skips: frozenset[int] = frozenset(), *, fix: bool = False) -> None:
        self.boundary = boundary
        self.skips = skips
        self.old, self.new = ("bad", "good") if fix else ("good", "bad")
        self.calls: list[int] = []

    def truth(self, candidate: int) -> str:
        return self.new if candidate >= self.boundary else self.old

    def __call__(self, candidate: int) -> str:
        self.calls.append(candidate)
        return "skip" if candidate in self.skips else self.truth(candidate)


def smallest_range(boundary: int, skips: frozenset[int], n: int) -> tuple[int, int]:
    """The last probe-able candidate before the boundary and the first one from it on."""
    last_old = max(i for i in range(boundary) if i not in skips)
    first_new = min(i for i in range(boundary, n) if i not in skips)
    return last_old, first_new


sizes = st.integers(min_value=2, max_value=400)
fast = settings(max_examples=300, deadline=None)


@fast
@given(data=st.data(), n=sizes, fix=st.booleans())
def test_both_ends_find_the_boundary_in_log_probes(data, n, fix):
    boundary = data.draw(st.integers(1, n - 1), label="boundary")
    oracle = Oracle(boundary, fix=fix)
    result = bisect(range(n), oracle, find_fix=fix)
    assert result.kind == "boundary"
    assert (result.last_old, result.first_new) == (boundary - 1, boundary)
    assert result.range == [boundary]
    if fix:
        assert (result.last_bad, result.first_good) == (boundary - 1, boundary)
        assert result.first_bad is None
    else:
        assert (result.last_good, result.first_bad) == (boundary - 1, boundary)
    assert len(set(oracle.calls)) == len(oracle.calls) == len(result.probes)
    assert len(result.probes) <= log2(n) + 2


@fast
@given(data=st.data(), n=sizes, fix=st.booleans())
def test_lone_new_end_searches_back_in_growing_steps(data, n, fix):
    boundary = data.draw(st.integers(1, n - 1), label="boundary")
    oracle = Oracle(boundary, fix=fix)
    result = bisect(list(range(n)), oracle, find_fix=fix, lone_end=True)
    assert result.kind == "boundary"
    assert (result.last_old, result.first_new) == (boundary - 1, boundary)
    assert len(set(oracle.calls)) == len(result.probes) <= 2 * log2(n) + 2
    back = [r.index for r in result.probes if r.phase == "search-back"]
    steps = [n - 1 - i for i in back]
    assert steps == [min(2**k, n - 1) for k in range(len(steps))]


@fast
@given(data=st.data(), n=st.integers(3, 200), lone=st.booleans())
def test_skips_give_the_smallest_range_holding_the_boundary(data, n, lone):
    boundary = data.draw(st.integers(1, n - 1), label="boundary")
    first = 0 if lone else 1
    skips = frozenset(data.draw(st.sets(st.integers(first, n - 2)), label="skips")) - (set() if lone else {0})
    assume(any(i not in skips for i in range(boundary)))
    assume(any(i not in skips for i in range(boundary, n)))
    if not lone:
        assume(0 not in skips and n - 1 not in skips)
    oracle = Oracle(boundary, skips)
    result = bisect(list(range(n)), oracle, lone_end=lone)
    last_old, first_new = smallest_range(boundary, skips, n)
    assert (result.last_old, result.first_new) == (last_old, first_new)
    assert result.range == list(range(last_old + 1, first_new + 1))
    assert result.kind == ("boundary" if first_new == last_old + 1 else "range")
    assert set(result.range[:-1]) <= set(result.skipped)
    assert len(set(oracle.calls)) == len(oracle.calls)


def test_lone_end_refuses_when_nothing_older_is_good():
    with pytest.raises(BisectRefused, match="no good candidate back to the oldest") as info:
        bisect(list(range(20)), Oracle(0), lone_end=True)
    assert info.value.result.kind == "refused"
    assert [r.index for r in info.value.result.probes] == [19, 18, 17, 15, 11, 3, 0]


@pytest.mark.parametrize(
    "boundary, fix, message",
    [
        (10, False, "do not differ: good end 0 and bad end 9 both probe good"),
        (0, False, "do not differ: good end 0 and bad end 9 both probe bad"),
        (0, True, "do not differ: good end 9 and bad end 0 both probe bad"),
    ],
)
def test_refuses_when_the_endpoints_agree(boundary, fix, message):
    oracle = Oracle(boundary)
    with pytest.raises(BisectRefused, match=message) as info:
        bisect(list(range(10)), oracle, find_fix=fix)
    assert info.value.result.kind == "refused"
    assert sorted(r.index for r in info.value.result.probes) == [0, 9]
    assert isinstance(info.value, BisectError)


def test_refuses_swapped_endpoints_and_suggests_find_fix():
    with pytest.raises(BisectRefused, match="swapped.*with --find-fix"):
        bisect(list(range(10)), Oracle(5, fix=True))
    with pytest.raises(BisectRefused, match="swapped.*without --find-fix"):
        bisect(list(range(10)), Oracle(5), find_fix=True)


@pytest.mark.parametrize("skipped, lone", [(0, False), (9, False), (9, True)])
def test_refuses_an_endpoint_that_cannot_be_probed(skipped, lone):
    with pytest.raises(BisectRefused, match=f"end {skipped} could not be probed"):
        bisect(list(range(10)), Oracle(5, frozenset({skipped})), lone_end=lone)


def test_refuses_bad_input():
    with pytest.raises(BisectRefused, match="at least two candidates"):
        bisect([1], Oracle(1))
    with pytest.raises(BisectError, match="unique; repeated: 1"):
        bisect([0, 1, 1, 2], Oracle(1))
    with pytest.raises(BisectError, match="not one of"):
        bisect([0, 1], lambda c: "passed")


class FlakyOracle(Oracle):
    """The flake model: candidates in `flaky` answer each probe run independently with
    the wrong outcome with probability `p`; every other candidate always answers the truth.
    The log keeps, per candidate, whether each run lied."""

    def __init__(self, boundary: int, flaky: frozenset[int], p: float, rng: random.Random):
        super().__init__(boundary)
        self.flaky, self.p, self.rng = flaky, p, rng
        self.lies: dict[int, list[bool]] = {}

    def __call__(self, candidate: int) -> str:
        self.calls.append(candidate)
        truth = self.truth(candidate)
        lie = candidate in self.flaky and self.rng.random() < self.p
        self.lies.setdefault(candidate, []).append(lie)
        return ({"good": "bad", "bad": "good"}[truth]) if lie else truth

    def always_lied(self, candidate: int) -> bool:
        return all(self.lies.get(candidate, [False]))


@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    n=st.integers(2, 120),
    repeats=st.integers(1, 4),
    p=st.sampled_from([0.1, 0.3, 0.5, 0.9]),
    rng=st.randoms(use_true_random=False),
)
def test_flaky_oracle_never_gives_a_silently_wrong_boundary(data, n, repeats, p, rng):
    """Either the right boundary or an explicit `flaky` result naming a flaky candidate and
    both outcomes it gave. A wrong boundary is possible only when one of the two candidates
    around it is flaky and gave the same wrong answer in all `repeats` runs (probability at
    most 2 p**repeats): the engine cannot tell that from a true answer, and says so."""
    boundary = data.draw(st.integers(1, n - 1), label="boundary")
    flaky = frozenset(data.draw(st.sets(st.integers(0, n - 1), max_size=n), label="flaky"))
    oracle = FlakyOracle(boundary, flaky, p, rng)
    try:
        result = bisect(list(range(n)), oracle, repeats=repeats)
    except BisectRefused as refused:
        # only an endpoint that lied every time can make the endpoints agree or swap
        assert oracle.always_lied(0) or oracle.always_lied(n - 1), refused
        return
    if result.kind == "flaky":
        assert result.flaky.key in {str(i) for i in flaky}
        assert set(result.flaky.outcomes) == {"good", "bad"}
        assert repeats > 1
        return
    assert result.kind == "boundary"
    assert all(len(r.runs) == repeats for r in result.probes)
    if result.first_bad != boundary:
        assert oracle.always_lied(result.first_bad) or oracle.always_lied(result.last_good)


def flaky_bisects(p: float, repeats: int, seeds: int) -> dict[str, int]:
    counts = {"right": 0, "flaky": 0, "wrong": 0}
    for seed in range(seeds):
        oracle = FlakyOracle(37, frozenset({24, 36, 37, 49}), p, random.Random(seed))
        result = bisect(list(range(100)), oracle, repeats=repeats)
        counts["flaky" if result.kind == "flaky" else "right" if result.first_bad == 37 else "wrong"] += 1
    return counts


def test_repeats_turn_wrong_boundaries_into_flaky_results():
    """The flake model above with p = 0.3, and both candidates around the boundary flaky
    (the worst case). Probed once, most bisects land on a wrong boundary; probed 3 times,
    most say `flaky`, and a wrong boundary needs a consistent lie at the boundary:
    at most 2 p**3 of the bisects."""
    once = flaky_bisects(0.3, 1, 400)
    assert once["flaky"] == 0 and once["wrong"] > 250
    thrice = flaky_bisects(0.3, 3, 400)
    assert thrice["flaky"] > 300
    assert thrice["wrong"] <= 2 * 0.3**3 * 400


def test_state_file_resumes_an_interrupted_bisect(tmp_path):
    path = tmp_path / "state.json"
    meta = {"test": "tests/x.py::t", "axis": "torch"}
    full = Oracle(613)
    expected = bisect(list(range(1000)), full, repeats=2)

    class Interrupted(Exception):
        pass

    def interrupted_after(k: int, oracle: Oracle):
        def probe(candidate):
            if len(oracle.calls) == k:
                raise Interrupted
            return oracle(candidate)

        return probe

    first = Oracle(613)
    with pytest.raises(Interrupted):
        bisect(list(range(1000)), interrupted_after(7, first), repeats=2, state=BisectState.open(path, meta))
    saved = json.loads(path.read_text())
    assert sum(len(runs) for runs in saved["probes"].values()) == 7

    second = Oracle(613)
    events = []
    result = bisect(list(range(1000)), second, repeats=2, state=BisectState.open(path, meta), on_event=events.append)
    assert result.first_bad == expected.first_bad == 613
    assert sorted(first.calls + second.calls) == sorted(full.calls)
    assert [r.index for r in result.probes] == [r.index for r in expected.probes]
    resumed = [r for r in result.probes if r.resumed]
    assert [r.index for r in resumed] == [999, 0, 499]
    half = next(r for r in result.probes if r.index == 749)
    assert [run.resumed for run in half.runs] == [True, False]
    assert any(e.resumed for e in events)
    assert "from state" in str(next(e for e in events if e.resumed))

    with pytest.raises(BisectError, match="another bisect .*test: saved"):
        BisectState.open(path, {"test": "tests/y.py::t", "axis": "torch"})


def test_resume_with_more_repeats_runs_only_the_missing_ones(tmp_path):
    path = tmp_path / "state.json"
    once = Oracle(5)
    bisect(list(range(10)), once, state=BisectState.open(path))
    again = Oracle(5)
    result = bisect(list(range(10)), again, repeats=3, state=BisectState.open(path))
    assert sorted(again.calls) == sorted(once.calls * 2)
    assert all(len(r.runs) == 3 for r in result.probes)


def test_a_flaky_run_in_the_state_stays_flaky(tmp_path):
    state = BisectState(tmp_path / "s.json")
    answers = iter(["bad", "good"])
    result = bisect(list(range(10)), lambda c: next(answers), repeats=2, state=state)
    assert result.kind == "flaky" and result.flaky.outcomes == ["bad", "good"]
    assert "9 is flaky: 2 runs answered bad, good" in result.reason
    resumed = bisect(list(range(10)), Oracle(5), repeats=2, state=BisectState.open(tmp_path / "s.json"))
    assert resumed.kind == "flaky" and resumed.flaky.resumed


def test_progress_counts_steps_of_about_log2_n():
    events = []
    result = bisect(list(range(1000)), Oracle(321), on_event=events.append)
    finished = [e for e in events if e.outcome is not None]
    assert [e.step for e in finished] == list(range(1, len(result.probes) + 1))
    assert finished[0].about == log2(999) + 2 == 12
    assert all(e.about >= e.step for e in events)
    assert str(events[0]) == "step 1 of about 12 [verify] 999: probing"


def test_report_shows_cold_and_warm_probe_times(tmp_path):
    warm: set[int] = set()

    def probe(candidate: int) -> ProbeOutcome:
        cached = candidate in warm
        warm.add(candidate)
        return ProbeOutcome(
            "bad" if candidate >= 6 else "good", cached=cached, detail="exit 0", setup_seconds=0.0 if cached else 1.0
        )

    cold_run = bisect(list(range(10)), probe)
    warm_run = bisect(list(range(10)), probe)
    assert result_to_dict(cold_run)["timing"].keys() == {"cold"}
    report = json.loads(
        write_report(tmp_path / "r.json", warm_run, meta={"axis": "torch"}, resume="nox -s bisect").read_text()
    )
    assert report["timing"]["warm"]["runs"] == len(warm_run.probes)
    assert (report["kind"], report["last_good"], report["first_bad"]) == ("boundary", "5", "6")
    assert report["probes"][0]["runs"][0]["setup_seconds"] == 0.0
    assert report["meta"] == {"axis": "torch"} and report["resume"] == "nox -s bisect"
    assert "first bad: 6 (last good: 5)" in format_result(warm_run)


def test_report_of_a_range_lists_the_skipped_candidates():
    result = bisect(list(range(10)), Oracle(6, frozenset({4, 5, 6})))
    report = result_to_dict(result)
    assert (report["kind"], report["last_good"], report["first_bad"]) == ("range", "3", "7")
    assert report["range"] == ["4", "5", "6", "7"]
    assert set(report["skipped"]) == {"4", "5", "6"}
    text = format_result(result)
    assert "4 candidates after 3 up to 7; 3 could not be probed" in text


def test_refusal_says_why_an_endpoint_was_skipped():
    def probe(candidate: int) -> ProbeOutcome:
        if candidate == 0:
            return ProbeOutcome("skip", detail="pip install failed (exit 1)\nERROR: no wheel")
        return ProbeOutcome("bad")

    with pytest.raises(BisectRefused, match=r"good end 0 could not be probed \(skip: pip install failed \(exit 1\)\)"):
        bisect(list(range(5)), probe)


@pytest.mark.parametrize("with_compare", [True, False])
def test_markdown_of_a_torch_boundary_names_both_builds_and_the_compare_url(tmp_path, with_compare):
    """`--markdown` on a torch nightly bisect crashed after the answer (KeyError: 'compare'):
    the builds' git hashes came without the compare URL. A report written before they
    carried one still gets it."""
    from distci.bisect.below import COMPARE_URL
    from distci.bisect.report import to_markdown

    old, new = "8" * 40, "c" * 40
    commits = {"last_old": old, "first_new": new}
    if with_compare:
        commits["compare"] = COMPARE_URL.format(good=old, bad=new)
    result = bisect(list(range(4)), Oracle(2))
    data = json.loads(write_report(tmp_path / "r.json", result, meta={}, resume="", extra={"commits": commits}).read_text())
    text = to_markdown(data, command="nox -s bisect -- versions ...")
    assert f"- last good: `{old}`" in text and f"- first bad: `{new}`" in text
    assert f"- compare: https://github.com/pytorch/pytorch/compare/{old}...{new}" in text
