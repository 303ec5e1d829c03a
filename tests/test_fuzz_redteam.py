"""The ops generator's red-team widenings (reports/fuzz-ops-2026-12-07-redteam.md): the `use=first`
form (the loss reads only the first output of a multi-output op) and the `index_put` entry.

Quick: the forms are drawn by the seed the trial ran, from their own stream (every case drawn
before keeps its id once its forms are taken out), a form shrinks to the plain case, every entry
whose call returns several differentiable outputs carries the form, the judge gives the unread
outputs no cotangent, and the generator's finds file under the registered upstream bugs.
The planted bug the form finds is `unread_ones` in tests/test_fuzz_ops.py (slow, long).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from distci.fuzz import ops as ops_engine
from distci.fuzz.ops import draw_cases
from distci.known_issues import load_registry
from distci.op_case import parse_case
from distci.op_inventory import BY_NAME, INVENTORY, USE
from distci.op_shrink import simpler
from distci.stack import Stack

REPO = Path(__file__).resolve().parents[1]
SEED = "2026-12-07"


def test_the_trial_seed_draws_unread_outputs_and_index_put_into_an_activation():
    cases = draw_cases(SEED, 0, 1200)
    unread = [c for c in cases if c.param.get("use") == "first"]
    assert {"split", "chunk", "unbind"} <= {c.op for c in unread} <= {s.name for s in INVENTORY if s.forms.get("use")}
    assert len(unread) >= 20
    assert any(c.op == "index_put" and c.param["base"] == "clone" for c in cases)
    assert all(parse_case(c.id).id == c.id for c in unread)


def test_forms_never_move_what_a_seed_drew_before_them(monkeypatch):
    with_forms = draw_cases("forms", 0, 600)
    monkeypatch.setattr(ops_engine, "draw_forms", lambda seed, index, spec: ())
    plain = draw_cases("forms", 0, 600)
    assert any(a.id != b.id for a, b in zip(with_forms, plain))
    for a, b in zip(with_forms, plain):
        forms = BY_NAME[a.op].forms
        assert tuple(p for p in a.params if p[0] not in forms) == b.params
        assert (a.op, a.mesh, a.dtype, a.shapes, a.placements, a.seed) == (b.op, b.mesh, b.dtype, b.shapes,
                                                                           b.placements, b.seed)


def test_a_form_shrinks_to_the_plain_case():
    case = parse_case("split~2~f32~4x6~S0~size=2,dim=-1,use=first~0")
    assert "split~2~f32~4x6~S0~size=2,dim=-1~0" in [c.id for c in simpler(case)]
    assert all(c.param.get("use") in (None, "first") for c in simpler(case))


def test_every_entry_with_several_differentiable_outputs_carries_the_use_form():
    torch = pytest.importorskip("torch")
    from suites.generators.op_calls import CALLS, Context
    from suites.generators.ops_cases import full_inputs

    def like(t, k):
        return torch.zeros_like(t)

    several = set()
    for i, case in enumerate(draw_cases("outputs", 0, 2000)):
        spec = BY_NAME[case.op]
        if not spec.grad or case.op in several:
            continue
        ins = [t.requires_grad_(a.grad and t.is_floating_point())
               for a, t in zip(spec.args, full_inputs(case, torch.device("cpu")))]
        try:
            outs = CALLS[case.op](ins, case.param, Context(like))
        except Exception:  # a draw the op does not take: another case of the op decides
            continue
        if sum(1 for o in outs if o.requires_grad) > 1:
            several.add(case.op)
    assert several == {s.name for s in INVENTORY if s.forms.get("use") == USE["use"]}


def test_the_judge_gives_an_unread_output_no_cotangent():
    torch = pytest.importorskip("torch")
    from suites.generators.ops_cases import _cotangents

    outs = [torch.ones(2, requires_grad=True) * 1, torch.ones(2, requires_grad=True) * 1]
    first = _cotangents(parse_case("split~2~f32~4~S0~size=2,dim=0,use=first~0"), outs)
    every = _cotangents(parse_case("split~2~f32~4~S0~size=2,dim=0~0"), outs)
    assert first[0] is not None and first[1] is None
    assert all(c is not None for c in every)


@pytest.mark.parametrize("test_id,signature,torch_version,entry", [
    ("suites/generators/ops_entry.py::test_op_case[split~2~f32~4x6~S0~size=2,dim=-1,use=first~0]",
     "the backward raised RuntimeError: aten.cat.default got mixed torch.Tensor and DTensor, need to convert all "
     "torch.Tensor to DTensor before calling distributed operators!", "2.13.0",
     "pytorch173123-dtensor-unread-output-grad"),
    ("suites/generators/ops_entry.py::test_op_case[unbind~2~f32~3x4x5~S1~dim=0,use=first~0]",
     "the backward raised RuntimeError: aten.stack.default got mixed torch.Tensor and DTensor", "2.15.0",
     "pytorch173123-dtensor-unread-output-grad"),
    ("suites/generators/ops_entry.py::test_op_case[index_put~2~f32~6x4,6,6x4~R,R,R~base=clone~0]",
     "the backward raised RuntimeError: aten.index_put.default got mixed torch.Tensor and DTensor", "2.13.0",
     "pytorch118461-dtensor-index-put-backward"),
    # a plain-tensor gradient of an output every case reads is another bug, not this entry's
    ("suites/generators/ops_entry.py::test_op_case[split~2~f32~4x6~S0~size=2,dim=-1~0]",
     "the backward raised RuntimeError: aten.cat.default got mixed torch.Tensor and DTensor", "2.13.0", None),
])
def test_the_finds_file_under_the_registered_upstream_bug(test_id, signature, torch_version, entry):
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    assert registry.match(test_id, signature, "", Stack(torch=torch_version)) == entry


@pytest.mark.parametrize("case_id,error", [
    # the caller wrote the indexed write in place: DTensor's refusal to change its placement
    ("index_put~2~f32~6x4,6,6x4~S0,R,R~base=new_empty~0",
     "aten.index_put_.default: in-place operations that require placement changes are not supported. The input "
     "has placement (Shard(dim=0),), but no valid strategy preserves it."),
    # unbind along a sharded dim, refused for every size (the trial run's unbind~2~f32~0x1x1~S0~dim=0~0)
    ("unbind~2~f32~4x1x1~S0~dim=0~0",
     "('Attempted to unbind along the sharded dimension 0. ', 'It cannot be performed without redistribution, "
     "which is disallowed by the current operator.')"),
])
def test_a_named_refusal_of_the_ops_own_call_is_a_gap_and_a_find_in_backward(case_id, error):
    """Refusals that name the limit, like "Please redistribute": nothing is computed wrong and the
    caller can act, so a gap of the op's call; inside a backward nobody can (a find)."""
    pytest.importorskip("torch")
    from suites.generators.ops_cases import CaseOutcome, _raised

    def done(status, signature=None, message=""):
        return CaseOutcome(status, signature, message)

    case, exc = parse_case(case_id), RuntimeError(error)
    assert _raised(case, exc, "the op", done).status == "gap"
    assert _raised(case, exc, "the backward", done).status == "fail"
