"""The fuzzer's space and engine without torch: validity, the table's rows as points, seeded
draws, pairwise coverage, and shrinking against bugs declared as predicates over axes."""

from __future__ import annotations

import itertools

import pytest

from distci.fuzz import space as fuzz_space
from distci.fuzz.engine import Fuzzer, ShrinkLimits
from distci.fuzz.records import Outcome, Report
from distci.fuzz.space import Drawer, smaller
from suites.scenario import table as sc
from suites.generators import space as cell
from suites.generators.space import AXES, AXIS_VALUES, SIZES, SizedScenario, key, point_from_id, point_of, scenario


def Space(**kwargs) -> fuzz_space.Space:
    """The fuzzer's space over this checkout's cell side (what `distci fuzz` builds)."""
    return fuzz_space.Space(cell, **kwargs)


def test_every_table_row_is_a_valid_point():
    space = Space(device_type=None)
    for row in sc.TABLE:
        point = point_of(row)
        assert space.problems(point) == [], row.id
        assert scenario(point, tier=row.tier) == row
        assert key(point) == row.id


def test_the_axes_are_the_tables_columns_then_the_sizes():
    columns = [a for a in AXES if a not in SIZES]
    assert [a.name for a in columns] == [c.name for c in sc.COLUMNS if c.axis]
    assert [a.name for a in AXES[len(columns):]] == ["steps", "dim", "seq", "layers"]
    for a in columns:
        assert a.values == sc.COLUMN[a.name].values
        assert a.size == (type(a.values[0]) is int)
    for a in SIZES:
        assert a.size and a.goal == min(a.values) < a.default


def test_a_sized_point_runs_its_sizes_and_names_them_in_its_id():
    s = scenario({"parallel": "tp_sp", "steps": 2, "dim": 64, "seq": 16, "layers": 1})
    assert isinstance(s, SizedScenario)
    assert s.id == "tp_sp-eager-steps2-dim64-seq16-layers1"
    assert s.steps == 2 and [s.seq_len(i) for i in range(2)] == [16, 16]
    args = s.model_args
    assert (args.dim, args.ffn_hidden, args.max_seq_len, args.n_layers) == (64, 128, 16, 1)
    moe = scenario({"parallel": "tp", "model": "moe", "dim": 256}).model_args
    assert (moe.dim, moe.expert_hidden, moe.n_experts) == (256, 2 * sc.MOE_MODEL.expert_hidden, sc.MOE_MODEL.n_experts)
    # the id names the point back (a rerun or a bisect probe of a sized find needs nothing else)
    assert key(point_from_id(s.id)) == s.id
    assert point_from_id(s.id)["steps"] == 2
    # at the table's sizes it is the table's own Scenario
    assert type(scenario({"parallel": "tp_sp", "steps": sc.STEPS})) is sc.Scenario


def test_a_size_keeps_the_rows_tie_and_uneven_dims():
    s = scenario({"parallel": "fsdp", "tie": True, "shard": "uneven", "dim": 64})
    args = s.model_args
    assert s.id == "fsdp-eager-tied-uneven-dim64"
    assert (args.dim, args.ffn_hidden, args.vocab_size, args.tie) == (64, 127, sc.MODEL.vocab_size + 1, True)
    assert key(point_from_id(s.id)) == s.id
    assert any("multiple of 16" in p for p in Space(device_type=None).problems(
        {"parallel": "fsdp", "shard": "uneven", "float8": "rowwise"}))


def test_size_rules_refuse_what_a_row_fixes_itself():
    space = Space(device_type=None)
    assert any("static, non-resumed" in p for p in space.problems({"parallel": "tp", "shapes": "varlen", "steps": 2}))
    assert any("static sequence length" in p for p in space.problems({"parallel": "tp", "shapes": "varlen", "seq": 16}))
    assert any("one block per stage" in p for p in space.problems(
        {"parallel": "pp", "schedule": "gpipe", "accum": 2, "layers": 1}))


def test_a_size_shrinks_below_the_tables_default_smallest_first():
    keys = [key(p) for p in smaller(Space(), {"parallel": "tp", "steps": 6})]
    assert keys[:4] == ["tp-eager-steps1", "tp-eager-steps2", "tp-eager", "tp-eager-steps4"]
    # at the table's default a size still shrinks (toward its smallest value)
    assert [key(p) for p in smaller(Space(), {"parallel": "tp"})] == [
        "tp-eager-steps1", "tp-eager-steps2", "tp-eager-dim64", "tp-eager-seq16", "tp-eager-layers1"]


def test_an_invalid_point_names_the_rule_it_breaks():
    space = Space(device_type=None)
    assert any("mixed precision is FSDP2's" in p for p in space.problems({"mp": "bf16"}))
    assert any("expert parallel needs the moe model" in p for p in space.problems({"parallel": "ep"}))
    assert Space(device_type="cpu").problems({"parallel": "tp_sp", "float8": "tensorwise"})  # gloo: no float8
    assert Space(device_type="cuda").problems({"parallel": "tp_sp", "float8": "tensorwise"}) == []


def test_device_rules_keep_cpu_draws_runnable():
    space = Space(device_type="cpu")
    drawer = Drawer(space, "cpu")
    for _ in range(25):
        s = scenario(drawer.draw())
        assert not s.async_tp
        assert not s.float8_all_gather, s.id


def test_same_seed_same_draws_and_another_seed_other_draws():
    a = [key(Drawer(Space(), "2026-12-01").draw()) for _ in range(1)]
    one, two, other = Drawer(Space(), "2026-12-01"), Drawer(Space(), "2026-12-01"), Drawer(Space(), "2026-12-02")
    first = [key(one.draw()) for _ in range(12)]
    assert first == [key(two.draw()) for _ in range(12)]
    assert first[0] == a[0]
    assert first != [key(other.draw()) for _ in range(12)]
    assert len(set(first)) == 12


def test_pairwise_bias_covers_pairs_faster_than_plain_sampling():
    space = Space().restrict({"parallel": ["tp", "fsdp"], "compile": ["none"], "backend": ["none"],
                              "world_size": [2], "resume": ["none"], "model": ["dense"], "mp": ["none"]})
    biased, plain = Drawer(space, "p"), Drawer(space, "p", candidates=1)
    for _ in range(12):
        biased.draw()
        plain.draw()
    assert len(biased.tried) > len(plain.tried)


def test_restrict_names_a_bad_value():
    with pytest.raises(ValueError, match="--space ac: sometimes not among none, full, selective"):
        Space().restrict({"ac": ["sometimes"]})
    with pytest.raises(ValueError, match="unknown axis"):
        Space().restrict({"acc": ["none"]})


def test_smaller_resets_dependents_with_the_axis():
    point = {**point_of(sc.SCENARIOS["tp_sp-compile_block-ac_full"])}
    keys = [key(p) for p in smaller(Space(), point)]
    assert "tp-compile_block-ac_full" in keys
    assert "tp_sp-eager-ac_full" in keys  # compile -> none took the backend with it
    assert "tp_sp-compile_block" in keys


def _oracle(bug):
    """A batch runner whose configurations fail with one signature exactly where `bug(point)`."""
    calls = []

    def run(points):
        calls.append([key(p) for p in points])
        return [Outcome(p, "failed" if bug(p) else "passed", "AssertionError: bug" if bug(p) else None, 1.0)
                for p in points]
    run.calls = calls
    return run


SMALL = Space().restrict({name: AXIS_VALUES[name] for name in (
    "parallel", "compile", "backend", "ac", "float8", "train", "mp", "accum", "world_size", "optim", "eval")} | {
    name: (a.default,) for name, a in ((a.name, a) for a in AXES) if name not in (
    "parallel", "compile", "backend", "ac", "float8", "train", "mp", "accum", "world_size", "optim", "eval")})
"""Eleven axes drawn, the rest fixed at their defaults: a bug's pair is hit within a few dozen draws."""

BUGS = {
    "fsdp x ac full": (lambda p: p["parallel"] == "fsdp" and p["ac"] == "full", {"parallel": "fsdp", "ac": "full"}),
    "accumulation": (lambda p: p["accum"] >= 2, {"accum": 2}),
    "rowwise cast under sp": (lambda p: p["float8"] == "rowwise" and p["parallel"] == "tp_sp",
                              {"parallel": "tp_sp", "float8": "rowwise"}),
}


@pytest.mark.parametrize("name", list(BUGS))
def test_a_failure_shrinks_to_the_axes_the_bug_needs(name):
    bug, needs = BUGS[name]
    space = SMALL
    report = Fuzzer(space, "shrink", _oracle(bug), max_configs=80, log=lambda m: None).run()
    assert report.finds, f"{name}: 80 draws never hit it"
    find = report.finds[0]
    assert space.non_default(find.shrunk.case) == needs
    assert find.complete


def test_the_same_seed_replays_draws_and_shrink_path():
    bug = BUGS["fsdp x ac full"][0]
    runs = [_oracle(bug), _oracle(bug)]
    reports = [Fuzzer(SMALL, "replay", r, max_configs=20, log=lambda m: None).run() for r in runs]
    assert runs[0].calls == runs[1].calls
    assert [o.key for o in reports[0].tried] == [o.key for o in reports[1].tried]


def test_a_known_issue_and_a_repeat_are_not_shrunk_again():
    def run(points):
        return [Outcome(p, "failed", "E: same", 1.0, known_issue="ki-1" if p["optim"] == "adamw" else None)
                for p in points]
    report = Fuzzer(Space(), "k", run, max_configs=8, batch_size=4, shrink=False, log=lambda m: None).run()
    assert len(report.finds) == 1
    assert len(report.known) + len(report.repeats) == 7


def test_the_budget_stops_a_shrink_and_says_so():
    ticks = itertools.count()
    report = Fuzzer(SMALL, "b", _oracle(BUGS["accumulation"][0]), budget_s=3, batch_size=40,
                    clock=lambda: next(ticks), log=lambda m: None).run()
    assert report.finds and not report.finds[0].complete
    assert report.finds[0].shrunk.failed


def _timed_oracle(bug, seconds: float):
    """A batch runner on a fake clock: every configuration takes `seconds`."""
    now = [0.0]

    def run(points):
        now[0] += seconds * len(points)
        return [Outcome(p, "failed" if bug(p) else "passed", "AssertionError: bug" if bug(p) else None, seconds)
                for p in points]
    return run, (lambda: now[0])


WIDE = Space().restrict({"world_size": [2], "resume": ["none"], "compile": ["none"], "backend": ["none"]})
"""Every axis drawn but the costly ones: a draw carries a dozen axes off their default, so a
find's full shrink takes many rounds."""


def test_shrinking_a_find_stops_at_its_limit_and_drawing_goes_on():
    bug = BUGS["accumulation"][0]
    limited_run, limited_clock = _timed_oracle(bug, 10.0)
    limited = Fuzzer(WIDE, "starve", limited_run, budget_s=400, clock=limited_clock, log=lambda m: None).run()
    assert limited.finds, "no draw hit the bug"
    find = limited.finds[0]
    # its own limit: a quarter of the 400 s budget (the one configuration a batch may overrun by aside)
    assert not find.complete and "its shrink limit of 100 s ran out" in find.stopped
    assert 100 <= find.seconds <= 110
    assert find.shrunk.failed and find.shrunk.signature == find.found.signature
    assert len(WIDE.non_default(find.shrunk.case)) < len(WIDE.non_default(find.found.case))
    # drawing went on after the find; without limits the shrink eats the budget
    assert len(limited.drawn) - limited.drawn.index(find.found.key) - 1 >= 10
    unlimited_run, unlimited_clock = _timed_oracle(bug, 10.0)
    unlimited = Fuzzer(WIDE, "starve", unlimited_run, budget_s=400, clock=unlimited_clock, log=lambda m: None,
                       limits=ShrinkLimits(per_find_max_s=1e9, per_find_share=1, total_share=1)).run()
    assert len(unlimited.drawn) < len(limited.drawn)


def test_all_shrinking_together_takes_at_most_half_the_budget():
    # every configuration with accumulation fails, each with its own signature: every one a new find
    now = [0.0]

    def run(points):
        now[0] += 10.0 * len(points)
        return [Outcome(p, "failed", f"E: accum {p['accum']} optim {p['optim']} ac {p['ac']}", 10.0)
                if p["accum"] > 1 else Outcome(p, "passed", None, 10.0) for p in points]
    report = Fuzzer(WIDE, "half", run, budget_s=400, clock=lambda: now[0], log=lambda m: None).run()
    assert len(report.finds) >= 3
    assert report.shrink_s <= 0.5 * 400 + 10
    assert any("the run's shrink share (50% of the budget) ran out" in f.stopped for f in report.finds)


def test_a_registered_entrys_near_miss_gets_one_quick_round_and_is_not_new():
    seen = []

    def run(points):
        seen.extend(key(p) for p in points)
        return [Outcome(p, "failed", "E: same", 1.0, near_miss="ki-1") for p in points]
    fuzzer = Fuzzer(WIDE, "k", run, log=lambda m: None)
    point = WIDE.complete({"parallel": "fsdp", "ac": "full", "optim": "adamw", "accum": 4, "eval": "no_grad"})
    fuzzer._found(Outcome(point, "failed", "E: same", 1.0, near_miss="ki-1"))
    find = fuzzer.report.finds[0]
    assert find.near_miss == "ki-1" and fuzzer.report.new == [] and fuzzer.report.near_misses == [find]
    assert len(find.steps) == 1 and not find.complete and "quick round" in find.stopped
    # one batch of the round, then the combination of its keepers with its own simplifications
    assert len(seen) <= fuzzer.batch_size + 1 + len(smaller(WIDE, find.shrunk.case))


def test_a_bug_of_the_second_step_shrinks_to_steps_2_and_the_smallest_sizes():
    space = Space().restrict({name: (a.default,) for name, a in ((a.name, a) for a in AXES)
                              if a not in SIZES and name not in ("parallel", "ac", "optim")}
                             | {"parallel": ["tp", "fsdp"]})
    report = Fuzzer(space, "steps", _oracle(lambda p: p["steps"] >= 2), max_configs=40, log=lambda m: None).run()
    find = report.finds[0]
    assert find.complete
    assert space.non_default(find.shrunk.case) == {"steps": 2, "dim": 64, "seq": 16, "layers": 1}


def test_a_timeout_is_listed_not_shrunk_and_a_hang_is_shrunk():
    def run(points):
        return [Outcome(p, "failed", "TestTimeout: rank(s) N, N still running at the test timeout", 1.0,
                        kind="timeout" if p["optim"] == "adamw" else "hang") if p["accum"] > 1
                else Outcome(p, "passed", None, 1.0) for p in points]
    report = Fuzzer(WIDE, "slow", run, max_configs=30, log=lambda m: None).run()
    assert report.slow and all(o.kind == "timeout" for o in report.slow)
    assert all(f.found.kind == "hang" for f in report.finds) and report.finds
    assert all(o.key not in {f.found.key for f in report.finds} for o in report.slow)


def test_a_replay_files_its_failure_as_a_run_does():
    """`distci fuzz --replay` files its one outcome through Report.file, as the fuzzer files a
    draw: a known issue's failure counts as known, a timeout as timed out, anything else
    stays a find (its summary once said "0 new find(s), 0 known issue(s)" for every replay)."""
    point = {"parallel": "tp", "resume": "single"}
    known = Outcome(point, "failed", "ValueError: groups", 1.0, known_issue="ki-1", kind="exception")
    slow = Outcome(point, "failed", "TestTimeout: rank(s) N still running", 1.0, kind="timeout")
    new = Outcome(point, "failed", "AssertionError: bug", 1.0, kind="assert")
    report = Report()
    assert [report.file(o) for o in (known, slow, new)] == ["known", "slow", None]
    assert report.known == [known] and report.slow == [slow]
    fuzzed = Fuzzer(WIDE, "files", lambda points: [new if p["accum"] > 1 else Outcome(p, "passed", None, 1.0)
                                                   for p in points], max_configs=1, log=lambda m: None)
    fuzzed._found(known)
    fuzzed._found(slow)
    assert fuzzed.report.known == [known] and fuzzed.report.slow == [slow] and not fuzzed.report.finds
