"""How sure an answer is: the defaults against a lying check, the one-flip assumption,
a second flip caught around the answer, a range that is not a culprit.

The engine is pure: the probes are plain functions, the simulation is
distci.bisect.simulate (the one that chose CONFIRM_RUNS), run here over fixed seeds.
"""

from __future__ import annotations

import pytest

from distci.bisect import bisect
from distci.bisect.args import BisectArgs, parse_bisect
from distci.bisect.command import EXIT_CODES, exit_code
from distci.bisect.engine import CONFIRM_RUNS, FLANKS
from distci.bisect.report import format_result, result_to_dict
from distci.bisect.simulate import SHAPES, run_one, simulate

SEEDS = 400


@pytest.mark.parametrize("p", [0.05, 0.1, 0.2])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_documented_defaults_name_no_wrong_culprit_with_exit_0(shape, p):
    defaults = BisectArgs()
    assert (defaults.repeats, defaults.confirm, defaults.flanks) == (1, CONFIRM_RUNS, FLANKS)
    tally = simulate(shape, p, SEEDS, repeats=defaults.repeats, confirm=defaults.confirm, flanks=defaults.flanks)
    assert tally.wrong == [], tally.row()
    assert tally.right > 0, tally.row()  # the defaults still answer, at every lie rate


def test_the_old_rule_did_name_wrong_culprits_so_the_simulation_can_see_it():
    """Confirming with one run (the issue's `repeats + 1`, re-using the search's run): the
    same seeds give wrong answers with exit 0, so the test above measures the rule."""
    wrong = sum(len(simulate(shape, 0.2, SEEDS, confirm=1, flanks=0).wrong) for shape in SHAPES)
    assert wrong > 0


def test_a_steady_check_is_answered_right_by_the_defaults_for_every_shape_and_direction():
    for shape, candidates in SHAPES.items():
        for culprit in (1, len(candidates) // 3, len(candidates) - 1):
            for fix in (False, True):
                assert run_one(candidates, culprit, 0.0, seed=0, find_fix=fix)[0] == "right", (shape, culprit, fix)


def _history(*flips: int):
    """A check whose answer flips at each of `flips` (good before the first)."""
    def probe(c: int) -> str:
        return "bad" if sum(c >= f for f in flips) % 2 else "good"
    return probe


def test_a_bug_that_came_and_went_is_not_named_as_a_culprit():
    # bad from 10, fixed at 20, back at 30: the search lands on 30, which is not where it began
    plain = bisect(range(41), _history(10, 20, 30))
    assert (plain.kind, plain.first_bad) == ("boundary", 30)  # what a one-flip search says
    result = bisect(range(41), _history(10, 20, 30), confirm=True, flanks=FLANKS)
    assert result.kind == "came-and-went"
    assert 10 <= result.flank.candidate < 20 and set(result.flank.outcomes) == {"bad"}
    assert len(result.flank.outcomes) == 1 + CONFIRM_RUNS  # confirmed like the answer
    text = format_result(result)
    assert "CAME AND WENT, no culprit named" in text and "assumes one flip" in text
    assert result_to_dict(result)["came_and_went"]["candidate"] == str(result.flank.candidate)


def test_a_clean_answer_states_the_assumption_and_what_was_probed_around_it():
    result = bisect(range(64), _history(40), confirm=True, flanks=FLANKS)
    assert (result.kind, result.first_bad) == ("boundary", 40)
    flanks = [r.index for r in result.probes if r.phase == "flank"]
    assert len(flanks) == 2 * FLANKS and {38, 41} <= {r.index for r in result.probes}  # the neighbours too
    text = format_result(result)
    assert "assumes one flip: every candidate before the change answers good, every one from it on bad" in text
    assert f"{1 + CONFIRM_RUNS} agreeing runs of each side of it ({CONFIRM_RUNS} fresh)" in text
    fix = bisect(range(64), _history(40), find_fix=False, confirm=0)
    assert "NOT confirmed (--no-confirm)" in format_result(fix)


def test_flanks_look_in_the_widest_stretch_the_search_left_unprobed():
    # the bug lived in 20..39 only: a neighbour of the pair (89) would never see it
    result = bisect(range(100), _history(20, 40, 90), confirm=True, flanks=FLANKS)
    assert result.kind == "came-and-went" and 20 <= result.flank.candidate < 40


def test_a_range_is_not_a_culprit_and_has_its_own_exit_code(capsys):
    def probe(c: int) -> str:
        return "skip" if c in (5, 6) else "bad" if c >= 6 else "good"

    result = bisect(range(10), probe, confirm=True, flanks=FLANKS)
    assert result.kind == "range" and list(result.range) == [5, 6, 7]
    assert format_result(result).startswith("RANGE, not a culprit: the change is one of 3 candidates")
    assert exit_code(result.kind, {}, "") == 3
    assert "a range, not a culprit" in capsys.readouterr().err


def test_every_end_has_its_exit_code_and_below_nightly_decides_when_it_bisected(capsys):
    assert EXIT_CODES["boundary"] == 0 and len({EXIT_CODES[k] for k in ("range", "came-and-went", "flaky")}) == 3
    assert exit_code("boundary", {}, "") == 0
    assert exit_code("boundary", {"status": "listed"}, "") == 0  # not probed: the nightly pair is the answer
    assert exit_code("boundary", {"status": "range", "reason": "4 main commits"}, "") == 3
    assert exit_code("boundary", {"status": "came-and-went", "reason": "x"}, "") == 4
    assert exit_code("flaky", {}, "2.5.0 is flaky") == 1
    assert "came and went" in capsys.readouterr().err


def test_confirm_and_flanks_are_options_and_rerun_as_given():
    args, _ = parse_bisect(["versions", "t.py::x", "--bad", "2.6.0", "--confirm", "6", "--flanks", "0"])
    assert (args.confirm, args.flanks) == (6, 0)
    assert parse_bisect(args.to_argv())[0] == args
    off, _ = parse_bisect(["commits", "--command", "c", "--bad", "v2", "--repo", "r", "--no-confirm"])
    assert off.confirm == 0 and "--no-confirm" in off.to_argv()
    assert parse_bisect(["versions", "t", "--bad", "1", "--confirm"])[0].confirm == CONFIRM_RUNS
