"""The ops generator's in-place and random entries (reports/fuzz-ops-2026-12-07-inplace.md): drawn on
every placement trainers produce, and the random judge's value rules (suites/generators/ops_random.py)
able to fail. Quick: no ranks (the judge's replica and stream checks run on gloo ranks in the
`mask_redrawn` / `replica_drift` plants of tests/test_fuzz_ops.py, slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distci.fuzz.ops import draw_cases
from distci.known_issues import load_registry
from distci.op_case import parse_case
from distci.op_inventory import BY_NAME, INPLACE
from distci.stack import Stack

REPO = Path(__file__).resolve().parents[1]
NEW = ["inplace_scalar", "inplace_tensor", "dropout_train", "init_", "rand_like"]


def test_in_place_writes_are_drawn_on_partial_inputs_and_inits_never_are():
    cases = draw_cases("inplace", 0, 600, [BY_NAME[n] for n in NEW])
    by_op = {n: [c for c in cases if c.op == n] for n in NEW}
    assert all(by_op.values())
    for op in ("inplace_scalar", "inplace_tensor", "dropout_train"):
        places = {p for c in by_op[op] for p in c.placements[0]}
        assert {"Psum", "Pavg"} <= places, op
    assert not any(p.startswith("P") for c in by_op["init_"] for p in c.placements[0])
    assert {c.param["op"] for c in by_op["inplace_scalar"]} >= {"fill_", "zero_", "mul_", "detach_zero_"}
    assert all(BY_NAME[n].random for n in ("dropout_train", "init_", "rand_like"))
    assert not any(BY_NAME[n].random for n in ("inplace_scalar", "inplace_tensor"))


def test_the_inplace_form_rides_on_masked_fill_and_clamp_and_shrinks_away():
    from distci.op_shrink import simpler

    assert BY_NAME["masked_fill"].forms == INPLACE == BY_NAME["clamp"].forms
    cases = [c for c in draw_cases("inplace", 0, 400, [BY_NAME["clamp"]]) if c.param.get("inplace") == 1]
    assert cases
    case = parse_case("clamp~2~f32~3x4~Psum~lo=-0.5,hi=0.5,inplace=1~0")
    assert "clamp~2~f32~3x4~Psum~lo=-0.5,hi=0.5~0" in [c.id for c in simpler(case)]


def _full(case_id: str):
    torch = pytest.importorskip("torch")
    from suites.generators.ops_cases import full_inputs

    case = parse_case(case_id)
    return torch, case, full_inputs(case, torch.device("cpu"))


def test_dropout_values_must_be_zero_or_the_input_scaled():
    from suites.generators.ops_random import _value

    torch, case, (x,) = _full("dropout_train~2~f32~6x8~S0~p=0.5~3")
    mask = torch.arange(x.numel()).reshape(x.shape) % 3 != 0
    right = x * mask / 0.5
    assert _value(case, "output 0", right, right, [x]) is None
    shares_masked_apart = right.clone()
    shares_masked_apart[0, 0] = x[0, 0]  # kept, but unscaled: half of two shares' different masks
    problem = _value(case, "output 0", shares_masked_apart, right, [x])
    assert problem and problem.startswith("output 0: mask: not 0 or x / (1 - p)"), problem


def test_an_init_is_bounded_by_the_full_parameters_fans_not_a_shards():
    from suites.generators.ops_random import _value

    torch, case, (w,) = _full("init_~2~f32~4x16~S1~init=kaiming_uniform_~0")
    full_bound = (2.0 / 6.0) ** 0.5 * (3.0 / 16) ** 0.5  # fan_in of the whole weight
    shard_bound = (2.0 / 6.0) ** 0.5 * (3.0 / 8) ** 0.5  # what a shard's own fan_in would allow
    inside = torch.full((4, 16), full_bound * 0.99)
    assert _value(case, "output 0", inside, inside, [w]) is None
    per_shard = torch.full((4, 16), shard_bound * 0.99)
    problem = _value(case, "output 0", per_shard, per_shard, [w])
    assert problem and "output 0: value:" in problem and "for this full shape" in problem


@pytest.mark.parametrize("case_id,bad", [
    ("rand_like~2~f32~3x4~Psum~kind=bernoulli_~0", 2.0),  # two Partial shares' draws summed
    ("rand_like~2~f32~3x4~R~kind=rand_like~0", 1.5),
    ("rand_like~2~f32~3x4~R~kind=randn_like~0", float("nan")),
])
def test_a_draw_outside_what_the_op_draws_is_a_problem(case_id, bad):
    from suites.generators.ops_random import _value

    torch, case, (x,) = _full(case_id)
    ok = torch.zeros(3, 4)
    assert _value(case, "output 0", ok, ok, [x]) is None
    wrong = ok.clone()
    wrong[1, 2] = bad
    assert _value(case, "output 0", wrong, ok, [x])


@pytest.mark.parametrize("test_id,signature,entry", [
    ("suites/generators/ops_entry.py::test_op_case[inplace_scalar~2~f32~3x4~Psum~op=fill_,value=2.0~0]",
     "inplace_scalar: output 0: value", "dtensor-fill-partial-sum"),
    # zero_ of a Partial(sum) is right (0 summed is 0): a value find there is another bug
    ("suites/generators/ops_entry.py::test_op_case[inplace_scalar~2~f32~3x4~Psum~op=zero_,value=2.0~0]",
     "inplace_scalar: output 0: value", None),
    ("suites/generators/ops_entry.py::test_op_case[dropout_train~2~f32~3x4~Psum~p=0.5~0]",
     "the op raised RuntimeError: aten.bernoulli_.float: in-place operations that require placement changes are "
     "not supported. The input has placement (Partial(sum),), but no valid strategy preserves this placement.",
     "dtensor-dropout-partial"),
    ("suites/generators/ops_entry.py::test_op_case[rand_like~2x2~f32~1x1~Psum.S0~kind=bernoulli_~0]",
     "the op raised RuntimeError: aten.bernoulli_.float: in-place operations that require placement changes are "
     "not supported. The input has placement (Shard(dim=N), Partial(avg)), but no valid strategy preserves",
     "dtensor-dropout-partial"),
    ("suites/generators/ops_entry.py::test_op_case[inplace_tensor~2~f32~1x1,1x1~Pavg,S0~op=copy_,weight=0.1~0]",
     "the op raised RuntimeError: redistribute from S(N) to P(avg) not supported yet",
     "dtensor-inplace-shard-into-partial"),
    ("suites/generators/ops_entry.py::test_op_case[inplace_tensor~2~f32~1x1,1x1~Psum,Pavg~op=sub_,weight=0.1~0]",
     "the op raised AssertionError: Redistribution from one partial type (P(avg)) to another (P(sum)) is "
     "unsupported.", "dtensor-inplace-mixed-partial-types"),
])
def test_the_finds_file_under_their_registered_entries(test_id, signature, entry):
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    for version in ("2.13.0", "2.15.0"):
        assert registry.match(test_id, signature, "", Stack(torch=version)) == entry
