"""The fuzzer's space and engine without torch: validity, the table's rows as points, seeded
draws, pairwise coverage, and shrinking against bugs declared as predicates over axes."""

from __future__ import annotations

import itertools

import pytest

from suites import scenarios as sc
from suites.fuzz import Fuzzer, Outcome
from suites.space import AXES, AXIS_VALUES, Drawer, Space, key, point_of, scenario, smaller


def test_every_table_row_is_a_valid_point():
    space = Space(device_type=None)
    for row in sc.TABLE:
        point = point_of(row)
        assert space.problems(point) == [], row.id
        assert scenario(point, tier=row.tier) == row
        assert key(point) == row.id


def test_the_axes_are_the_tables_columns():
    assert [a.name for a in AXES] == [c.name for c in sc.COLUMNS if c.axis]
    for a in AXES:
        assert a.values == sc.COLUMN[a.name].values
        assert a.size == (type(a.values[0]) is int)


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
    assert space.non_default(find.shrunk.point) == needs
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
