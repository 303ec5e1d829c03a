"""The ops inventory's second round (reports/fuzz-ops-2026-12-10-inventory2.md): what models, losses
and training loops call on sharded tensors outside the transformer step of the first round
(distci/op_inventory.py ROUND_2, suites/generators/op_calls_round2.py).

Slow: cases a seed draws from the round run as one sweep on gloo ranks, each answered, a known
bug's case failing with its signature and a correct op passing. Quick: an unnarrowed seed draws every new entry on every placement, at its share of the inventory;
the widening moves only the indices it takes (the ids a seed drew before it are pinned, computed
at 8b147ad); each entry's outputs are judged, a wrong value, count or flag failing; the round's
finds file under their entries.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from distci.fuzz import ops as ops_engine
from distci.fuzz.ops import draw_cases
from distci.known_issues import load_registry
from distci.op_inventory import BY_NAME, INVENTORY, ROUND_1, ROUND_2, ROUNDS
from distci.stack import Stack
import test_fuzz_ops as shared

ops_session = shared.ops_session
"""The gloo session test_fuzz_ops.py's slow tests share (a fixture: one pytest session, its rank pools)."""

REPO = Path(__file__).resolve().parents[1]
NEW = {s.name for s in ROUND_2}


def test_an_unnarrowed_seed_draws_every_new_entry_at_its_share_on_every_placement():
    cases = draw_cases("round2", 0, 2000)
    new = [c for c in cases if c.op in NEW]
    assert {c.op for c in new} == NEW
    assert abs(len(new) / len(cases) - len(ROUND_2) / len(INVENTORY)) < 0.04
    places = {p for c in new for pl in c.placements for p in pl}
    assert {"R", "Psum", "Pavg", "S0", "S-1"} <= places and any(p.startswith("SS") for p in places)
    assert all(("/" in s.where or "." in s.where) and s.where for s in ROUND_2)  # names the file it read
    assert ROUNDS == (ROUND_1, ROUND_2) and not NEW & {s.name for s in ROUND_1}


PINNED = [  # draw_cases("stable", 1, 11) at 8b147ad, before the second round existed
    "softmax~2x2~f32~0x1x6~R.R~dim=-1~677", "init_~2~bf16~11x11~R~init=normal_~335",
    "reshape_merge~2~f32~5x11x2x5~S2~-~461", "softmax~2x2~bf16~11x0x7~S2.R~dim=1~241",
    "addmm~2x2~bf16~7,9x1,1x7~R.Psum,R.R,S-2.Psum~-~978", "argsort~4~f32~3~S0~-~80",
    "rotary_complex~2~f32~4x11x0x8,11x4~Psum,R~-~497", "rotary_complex~2~f32~13x7x1x24,7x12~S-2,Psum~-~281",
    "cat~4~bf16~8x13,8x13~R,R~dim=-2~40", "linear~2x2~f32~5x7x3,2x3,2~Pavg.R,S1.S1,R.R~bias=1~600",
    "softmax~2~f32~3x7~Psum~dim=-1~684",
]


def test_a_widening_moves_only_the_indices_it_takes(monkeypatch):
    assert [c.id for c in draw_cases("stable", 1, 11)] == PINNED  # index 0 went to round 2 (roll)
    assert draw_cases("stable", 0, 1)[0].op in NEW
    widened = draw_cases("stable", 0, 800)
    monkeypatch.setattr(ops_engine, "ROUNDS", (ROUND_1,))
    before = draw_cases("stable", 0, 800)
    kept = [(a.id, b.id) for a, b in zip(widened, before) if a.op not in NEW]
    assert all(a == b for a, b in kept)
    assert 0.65 < len(kept) / 800 < 0.83  # the first round's share, 76 of 103 entries
    assert [c.id for c in draw_cases("stable", 0, 5, [BY_NAME["cat"]])] == \
        [c.id for c in ops_engine.draw_cases("stable", 0, 5, [BY_NAME["cat"]])]  # --ops draws as before


def _perturbed(t):
    import torch

    out = t.clone(memory_format=torch.contiguous_format)
    flat = out.view(-1)
    if t.dtype == torch.bool:
        flat[0] = ~flat[0]
    elif t.is_floating_point():
        flat[0] += 1.0 + t.abs().max()  # a full-scale error: the judge is relative to max|ref|
    else:
        flat[0] += 1
    return out


@pytest.mark.parametrize("op", sorted(NEW))
def test_each_new_entry_is_judged_and_a_wrong_output_fails(op):
    """Each entry's reference outputs compare equal to themselves and a single wrong element (a value,
    a token count, a found_inf flag, an index) fails the judge's comparison."""
    torch = pytest.importorskip("torch")
    from suites.generators.op_calls import CALLS, Context
    from suites.generators.ops_cases import full_inputs
    from suites.generators.ops_checks import _compare

    spec = BY_NAME[op]
    judged = 0
    for case in draw_cases(f"judge-{op}", 0, 40, [spec]):
        ins = [t.requires_grad_(a.grad and spec.grad and t.is_floating_point())
               for a, t in zip(spec.args, full_inputs(case, torch.device("cpu")))]
        try:
            outs = CALLS[op](ins, case.param, Context(lambda t, k: torch.zeros_like(t)))
        except Exception:  # a draw the op does not take: an invalid case, not judged
            continue
        outs = [o.detach() for o in outs if o.numel() and torch.isfinite(o.double()).all()]
        for i, o in enumerate(outs):
            assert _compare(f"output {i}", o, o.clone(), case.dtype, 1) is None, case.id
            assert _compare(f"output {i}", _perturbed(o), o, case.dtype, 1), case.id
            judged += 1
    assert judged >= 5, op


@pytest.mark.parametrize("test_id,signature,entry", [  # the round's shrunk finds (seed 2026-12-07-round2)
    ('normalize~2~f32~1x0~Psum~dim=-1~0',
     'the backward raised RuntimeError: aten.masked_fill_.Scalar: in-place operations that require '
     'placement changes are not supported. The input has placement (Partial(sum),), but no valid '
     'strategy preserves this placement. Please use the out-of',
     'dtensor-normalize-partial-backward'),
    ('clip_loss~2~f32~1x1,1x1,1~R,Pavg,R~scale=14.3~0',
     'the backward raised RuntimeError: aten.masked_fill_.Scalar: in-place operations that require '
     'placement changes are not supported. The input has placement (Partial(avg),), but no valid '
     'strategy preserves this placement. Please use the out-of',
     'dtensor-normalize-partial-backward'),
    ('cosine_similarity~2x2~f32~1x1x1,1x1~Pavg.S0,R.R~dim=-1~0',
     'the backward raised RuntimeError: aten.masked_fill_.Scalar: in-place operations that require '
     'placement changes are not supported. The input has placement (Partial(avg), Shard(dim=N)), but '
     'no valid strategy preserves this placement. Please use the out-of',
     'dtensor-normalize-partial-backward'),
    ('cumprod~2~f32~1x2~R~dim=1~0',
     'the backward raised RuntimeError: aten.where.self got mixed torch.Tensor and DTensor, need to '
     'convert all torch.Tensor to DTensor before calling distributed operators!',
     'pytorch185362-dtensor-cumprod-backward'),
    ('cumprod~2~f32~2x1~S0~dim=-2~0',
     'cumprod: output 0: value',
     'dtensor-cumsum-negative-dim'),
    ('position_ids~2~f32~1x3~S1~-~0',
     'position_ids: output 0: value',
     'dtensor-cumsum-negative-dim'),
    ('causal_conv1d~2~f32~1x2x1,2x1x1,2~R,R,S0~-~0',
     'the op raised RuntimeError: Given weight of size [N, N, N], expected bias to be N-dimensional '
     'with N elements, but got bias of size [N] instead',
     'dtensor-conv2d-placements-ignored'),
    ('causal_conv1d~2~f32~1x1x1,1x1x1,1~R,R,Psum~-~0',
     'causal_conv1d: output 0: value',
     'dtensor-conv2d-placements-ignored'),
    ('causal_conv1d~2~f32~1x2x1,2x1x1,2~R,S0,R~-~0',
     'the op raised RuntimeError: Given groups=N, expected weight to be at least N at dimension N, '
     'but got weight of size [N, N, N] instead',
     'dtensor-conv2d-placements-ignored'),
    ('causal_conv1d~2~f32~1x1x1,1x1x1,1~R,S1,R~-~0',
     'the op with empty shards raised on ranks holding them only, the others hang: RuntimeError: '
     'Given groups=N, weight of size [N, N, N], expected input[N, N, N] to have N channels, but got '
     'N channels instead',
     'dtensor-conv2d-placements-ignored'),
    ('count_tokens~2~f32~1~R~how=bincount,bins=1~0',
     'the op raised RuntimeError: aten.bincount.default',
     'dtensor-bincount-data-dependent'),
    ('group_norm~2~f32~2x1x1,1,1~Psum,R,S0~groups=1~0',
     'the backward raised RuntimeError: Expected dY.numel() == N * C * HxW to be true, but got '
     'false. (Could this error message be improved? If so, please report an enhancement request to '
     'PyTorch.)',
     'pytorch184825-dtensor-group-norm-backward'),
    ('group_norm~2~f32~1x1x0,1,1~R,R,R~groups=1~0',
     'the backward raised RuntimeError: float division by zero',
     'pytorch184825-dtensor-group-norm-backward'),
    ('logsumexp~2~f32~2x1x1~S2~dim=0,keepdim=1,then=z_loss~445',
     'logsumexp: every rank waits in a collective its peers never issue (a deadlock)',
     'dtensor-logsumexp-keepdim-positional'),
    ('logsumexp~2~f32~1x6~S1~dim=0,keepdim=1,then=z_loss~0',
     'the backward raised RuntimeError: The size of tensor a (N) must match the size of tensor b (N) '
     'at non-singleton dimension N',
     'dtensor-logsumexp-keepdim-positional'),
    ('logsumexp~2x2~f32~9x16~S-1.S1~dim=0,keepdim=1,then=z_loss~304',
     'the backward raised on some ranks only, the others hang: RuntimeError: narrow unexpectedly '
     'changed concrete size on dim N: N -> N',
     'dtensor-logsumexp-keepdim-positional'),
    ('fp8_scale~2~f32~6x7x1~S2~granularity=rowwise~609',
     'the op with empty shards raised on ranks holding them only, the others hang: IndexError: '
     'amax(): Expected reduction dim -N to have non-zero size.',
     'dtensor-max-empty-shard'),
    ('causal_conv1d~2~f32~1x1x1,1x1x1,1~S2,S2,R~-~0',
     'the op with empty shards raised on ranks holding them only, the others hang: RuntimeError: Only '
     'zero batch or zero channel inputs are supported, but got input shape: [N, N, N, N]',
     'dtensor-conv2d-placements-ignored'),
    ('fp8_scale~2~bf16~5x1x4~S1~granularity=tensorwise~185',
     'the op with empty shards raised on ranks holding them only, the others hang: RuntimeError: max(): '
     "Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' "
     'argument.',
     'dtensor-max-empty-shard'),
    ('interpolate~2~f32~0x1x1x1~R~mode=nearest,size=3~0',
     "the op raised RuntimeError: cond must be a bool, but got <class 'int'>",
     'pytorch195376-upsample-nearest-meta-empty'),
    ('logsumexp~2~f32~1x1x1~S2~dim=1,keepdim=1,then=none~0', 'logsumexp: output 0: local shape',
     'dtensor-logsumexp-keepdim-positional'),
    ('group_norm~2~f32~0x2x1,2,2~R,S0,R~groups=2~0',
     'the backward raised RuntimeError: Expected !gamma.defined() || gamma.numel() == C to be true, but got '
     'false. (Could this error message be improved? If so, please report an enhancement request to PyTorch.)',
     'pytorch184825-dtensor-group-norm-backward'),
    ('causal_conv1d~2x2~f32~4x1x1,1x1x1,1~R.Psum,R.R,R.S0~-~0',
     'the op raised ValueError: Tensor dim N is already sharded on mesh dim N, DTensor operator implementation '
     'does not support things like hybrid sharding strategies yet (i.e. [Shard(N), Shard(N)])',
     'dtensor-conv2d-placements-ignored'),
    ('causal_conv1d~2~f32~1x1x1,1x1x1,1~S0,R,R~-~0', 'causal_conv1d: output 0: local shape',
     'dtensor-conv2d-placements-ignored'),
    ('logsumexp~2x2~bf16~7x11~S0.S-1~dim=-2,keepdim=1,then=z_loss~597',
     'RankCrash: rank 1 killed by SIGSEGV (ranks 1, 3 died)', 'dtensor-logsumexp-keepdim-positional'),
    ('logsumexp~2x2~f32~7x2~S1.S-1~dim=0,keepdim=1,then=z_loss~514',  # the confirmation run's face
     'the backward with empty shards raised on ranks holding them only, the others hang: RuntimeError: '
     'narrow unexpectedly changed concrete size on dim N: N -> N', 'dtensor-logsumexp-keepdim-positional'),
])
def test_the_round_finds_file_under_their_entries(test_id, signature, entry):
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    full = f"suites/generators/ops_entry.py::test_op_case[{test_id}]"
    assert registry.match(full, signature, "", Stack(torch="2.13.0")) == entry


def test_the_float8_scale_has_no_backward_because_a_partial_sum_can_cross_its_bound():
    """The first run differentiated fp8_scale through its clamp to the float8 bound and filed
    `fp8_scale~2~f32~6x9~Psum~granularity=rowwise~0` (gradient of input 0): row 4's largest element
    lands on 448.00003 when the two Partial shares are scaled and summed, so the clamp zeroes its
    gradient where the full tensor's 448.0 keeps it. torchao never differentiates that clamp (its cast
    is straight-through): a distci bug, fixed by giving the entry no backward."""
    torch = pytest.importorskip("torch")
    from distci.op_case import parse_case
    from suites.generators.op_calls_round2 import FLOAT8_MAX
    from suites.generators.ops_cases import _share_weight, full_inputs

    assert not BY_NAME["fp8_scale"].grad
    case = parse_case("fp8_scale~2~f32~6x9~Psum~granularity=rowwise~0")
    (x,) = full_inputs(case, torch.device("cpu"))
    scale = (FLOAT8_MAX / x.abs().amax(-1, keepdim=True).double()).float()
    shares = sum(x * (_share_weight(k, 2) / 2) * scale for k in range(2))
    assert (x * scale).abs().max() <= FLOAT8_MAX < shares.abs().max()


@pytest.mark.slow
def test_the_rounds_cases_are_judged_on_gloo_ranks(ops_session, tmp_path):
    pytest.importorskip("torch")
    keepdim = "logsumexp~2~f32~1x1x1~S2~dim=1,keepdim=1,then=none~0"  # dtensor-logsumexp-keepdim-positional
    sort = "sort~2~f32~3x4~S0~dim=-1,descending=1~0"
    drawn = [c.id for c in draw_cases("round2-judged", 0, 300) if c.op in NEW and c.mesh == "2"][:10]
    rows = shared._sweep(ops_session, tmp_path / "sweep", drawn + [keepdim, sort])
    assert set(rows) == set(drawn) | {keepdim, sort}
    assert all(r["status"] in ("pass", "fail", "gap", "invalid") for r in rows.values()), rows
    assert rows[keepdim]["status"] == "fail" and rows[keepdim]["signature"] == "logsumexp: output 0: local shape"
    assert rows[sort]["status"] == "pass", rows[sort]
