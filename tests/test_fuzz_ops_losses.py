"""The ops generator's losses as TP trainers call them (round 3, 2026-12-07): entries run under
loss_parallel() on the layout a loss-parallel run has (distci/op_inventory.py `context`,
`loss_parallel_layout`), the rule that keeps every other layout out of them, the context always
left, and the round's loss finds filed under their entries. The plant `lp_ignore_mean` is in
tests/test_fuzz_ops.py (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distci.fuzz.ops import draw_cases
from distci.known_issues import load_registry
from distci.op_case import meaningless, parse_case
from distci.op_inventory import BY_NAME, INVENTORY
from distci.op_shrink import simpler
from distci.stack import Stack

REPO = Path(__file__).resolve().parents[1]
LOSS_PARALLEL = [s for s in INVENTORY if s.context == "loss_parallel"]


def test_loss_parallel_entries_draw_vocab_sharded_logits_and_derived_targets():
    assert {s.name for s in LOSS_PARALLEL} >= {"lp_cross_entropy", "lp_soft_ce", "lp_kl_div", "lp_logprobs",
                                               "lp_z_loss", "lp_chunked_ce", "lp_nll_log_softmax"}
    cases = draw_cases("lp", 0, 400, LOSS_PARALLEL)
    assert {c.mesh for c in cases} == {"2", "4", "2x2"}
    for c in cases:
        assert not meaningless(c), c.id
        assert c.placements[0][-1] == "S-1" and not any(p.startswith("P") for pl in c.placements for p in pl), c.id
        if c.mesh == "2x2":  # batch-sharded (DP / CP) or replicated on dp; the targets follow the logits
            assert c.placements[0][0] in ("R", "S0")
            assert all(pl[0] in ("R", c.placements[0][0]) for pl in c.placements), c.id
    assert any(c.mesh == "2x2" and c.placements[0][0] == "S0" for c in cases)


@pytest.mark.parametrize("case_id", [
    "lp_cross_entropy~2~f32~4x3,4,3~R,R,R~reduction=sum,weight=0,label_smoothing=0.0~0",  # logits not sharded
    "lp_cross_entropy~2~f32~4x3,4,3~S-1,S0,R~reduction=sum,weight=0,label_smoothing=0.0~0",  # target sharded
    "lp_kl_div~2x2~f32~4x3,4x3~S0.S-1,R.S-1~temperature=2.0~0",  # teacher not batch-sharded as the student
    "lp_soft_ce~2~f32~4x3,4x3~Psum,S-1~how=probs~0",
])
def test_a_layout_loss_parallel_never_sees_is_meaningless(case_id):
    assert "not a loss-parallel layout" in meaningless(parse_case(case_id))


def test_shrinking_a_loss_parallel_case_keeps_its_layout():
    case = parse_case("lp_cross_entropy~2x2~bf16~11x5,11,5~S0.S-1,S0.R,R.R~reduction=mean,weight=1,"
                      "label_smoothing=0.0~565")
    smaller = simpler(case)
    assert smaller and all(not meaningless(c) for c in smaller)
    assert "lp_cross_entropy~2~bf16~11x5,11,5~S-1,R,R~reduction=mean,weight=1,label_smoothing=0.0~565" in \
        [c.id for c in smaller]  # the tp axis kept
    assert all(c.shapes[0][1] >= 2 for c in smaller)  # never an empty class shard on a 2-way tp axis


def test_the_loss_parallel_context_is_left_even_when_the_case_raises():
    pytest.importorskip("torch")
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel.loss import customized_loss_ops

    from suites.generators.ops_cases import op_context

    handlers = DTensor._op_dispatcher._custom_op_handlers
    with pytest.raises(RuntimeError):
        with op_context("loss_parallel"):
            assert set(customized_loss_ops) <= set(handlers)
            raise RuntimeError("the case raised")
    assert not set(customized_loss_ops) & set(handlers)
    with op_context(""):
        assert not set(customized_loss_ops) & set(handlers)


def test_a_reduction_none_read_back_from_an_id_is_the_reduction_not_an_invalid_draw():
    torch = pytest.importorskip("torch")
    from suites.generators.op_calls import CALLS, Context

    for op, extra in (("cross_entropy", []), ("lp_cross_entropy", [torch.ones(3)])):
        case = parse_case(f"{op}~2~f32~4x3,4~R,R~reduction=none,label_smoothing=0.0~0" if not extra else
                          f"{op}~2~f32~4x3,4,3~S-1,R,R~reduction=none,weight=0,label_smoothing=0.0~0")
        assert case.param["reduction"] is None  # how an id reads "none" back
        out = CALLS[op]([torch.randn(4, 3), torch.tensor([0, 1, 2, -100]), *extra], case.param,
                        Context(lambda t, k: t))
        assert out[0].shape == (4,)


@pytest.mark.parametrize("test_id,signature,entry", [
    ("lp_kl_div~2~f32~1x4,1x4~S-1,S-1~temperature=2.0~0", "lp_kl_div: gradient of input 0: value",
     "pytorch190746-loss-parallel-log-softmax"),
    ("lp_soft_ce~2~f32~1x4,1x4~S-1,S-1~how=probs~0", "lp_soft_ce: gradient of input 0: value",
     "pytorch190746-loss-parallel-log-softmax"),
    ("lp_cross_entropy~2~f32~1x3,1,3~S-1,R,R~reduction=sum,weight=0,label_smoothing=0.1~0",
     "the op raised RuntimeError: aten.masked_fill_.Scalar: in-place operations that require placement changes "
     "are not supported.", "distci-loss-parallel-label-smoothing"),
    ("lp_cross_entropy~2~f32~11x2,11,2~S-1,R,R~reduction=sum,weight=1,label_smoothing=0.0~0",
     "the backward raised RuntimeError: index -N is out of bounds for dimension N with size N",
     "dtensor-loss-parallel-weight-ignore-index"),
    ("lp_logprobs~2~f32~1x1x13,1x1,1x1~S-1,R,R~how=gather~0",
     "the op raised IndexError: too many indices for tensor of dimension N", "dtensor-gather-mask-partial-view"),
    ("lp_kl_div~2~f32~1x1,1x1~S-1,S-1~temperature=2.0~0",
     "lp_kl_div: every rank waits in a collective its peers never issue (a deadlock)",
     "dtensor-loss-parallel-empty-class-shard"),
    ("lp_z_loss~2~f32~4x3,4~S-1,R~coef=0.0001~0", "lp_z_loss: output 0: value", None),  # no entry takes it
])
def test_the_loss_finds_file_under_their_entries(test_id, signature, entry):
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    full = f"suites/generators/ops_entry.py::test_op_case[{test_id}]"
    for version in ("2.13.0", "2.15.0"):
        assert registry.match(full, signature, "", Stack(torch=version)) == entry


def test_the_named_loss_parallel_refusal_of_a_2d_mean_is_a_gap():
    pytest.importorskip("torch")
    from suites.generators.ops_cases import CaseOutcome, _raised

    case = parse_case("lp_nll_log_softmax~2x2~f32~1x11,1~R.S-1,R.R~reduction=mean~0")
    exc = NotImplementedError("loss_parallel() with reduction='mean' is only supported on one-dimensional "
                              "DeviceMesh; got mesh with ndim=2. Use reduction='sum' or 'none' instead.")
    assert _raised(case, exc, "the op", lambda s, sig=None, m="": CaseOutcome(s, sig, m)).status == "gap"
    assert BY_NAME["lp_nll_log_softmax"].context == "loss_parallel"
