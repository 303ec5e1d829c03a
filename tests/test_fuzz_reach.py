"""The generators reach real upstream bugs nobody listed (reports/fuzz-reach-2026-12-06.md, both
rounds: the ops and models widenings, then the programs generator's forms).

Each widening of a generator, grounded in trainer code, is proven here twice: the generator now
draws it (quick: seeded draws, no ranks), and where the upstream bug is present on this stack
a bounded run fails it and files it under its registered entry (slow: the seed's draw checked
here, and one `python -m distci run` of the drawn cases on 2 gloo ranks). Where the registry
says the entry does not apply to this stack, the same run must find nothing there: both
halves can fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import distci.program_forms as pf
import distci.training_program as tp
from distci.fuzz.models import ENTRY_TEST as MODELS_ENTRY, TEST_NAME as MODELS_TEST, Drawer, parse_space
from distci.fuzz.models import key as structure_key
from distci.fuzz.ops import draw_cases
from distci.fuzz.programs import draw, edits, smaller
from distci.known_issues import load_registry
from distci.op_inventory import BY_NAME
from distci.stack import Stack
from distci.training_program import parse as parse_program, split
from suites.generators.model_space import key, parse

REPO = Path(__file__).resolve().parents[1]
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"
CONV_ENTRY = "dtensor-conv2d-placements-ignored"
GROUPED_ENTRY = "pytorch183702-fsdp2-grouped-unit-shared-module"


def _width_sharded(case) -> bool:
    """The conv input sharded on its last (width) dim, however the draw wrote it."""
    last = len(case.shapes[0]) - 1
    return any(p in (f"S{last}", "S-1") for p in case.placements[0])


def test_the_ops_generator_draws_patch_convs_sharded_on_the_width_with_both_strides():
    cases = draw_cases("reach", 0, 120, [BY_NAME["conv2d_patch"]])  # the op alone: no widening moves it
    assert "ViTPatchEmbeddings" in BY_NAME["conv2d_patch"].where
    widths = [c for c in cases if _width_sharded(c)]
    assert {c.param["stride"] for c in widths} == {1, 2}, [c.id for c in cases[:20]]
    assert any(c.shapes[0][-1] % 4 == 0 and c.shapes[0][-1] for c in widths)  # a width both ranks split evenly
    # the weight and bias sharded too (a channel-sharded conv, FSDP2's layout before its all-gather): drawn
    # replicated only while sharded weights desynchronized sweeps (fixed since: docs/fuzz.md)
    assert any(set(c.placements[1]) != {"R"} for c in cases) and any(set(c.placements[2]) != {"R"} for c in cases)


def test_the_ops_generator_draws_the_in_place_aux_loss_on_a_partial_loss():
    cases = draw_cases("reach", 0, 120, [BY_NAME["loss_plus_aux"]])
    assert "mixtral" in BY_NAME["loss_plus_aux"].where
    # a loss reduced over a sharded dim is Partial: `loss += coef * aux` then adds in place to it
    assert any(c.param["inplace"] == 1 and any(p.startswith("S0") for p in c.placements[0]) for c in cases)


def test_the_models_generator_draws_grouped_units_with_a_head_reusing_mtp_module():
    drawer = Drawer("reach", parse_space(["parallel=fsdp"]))
    drawn = [drawer.draw() for _ in range(200)]
    assert any(s["wrap"] == "grouped" and s["mtp"] for s in drawn)
    assert any(s["wrap"] == "grouped" and s["tie"] for s in drawn)
    assert parse(key({"parallel": "fsdp", "mtp": True, "wrap": "grouped"})) == parse("fsdp-mtp-wrap_grouped")


@pytest.mark.parametrize("test_id,signature,torch_version,entry", [
    ("suites/generators/ops_entry.py::test_op_case[conv2d_patch~2~f32~2x3x4x8,5x3x2x2,5~S3,R,R~stride=2~0]",
     "AssertionError: conv2d_patch: output 0: local shape", "2.13.0", CONV_ENTRY),
    ("suites/generators/ops_entry.py::test_op_case[conv2d_patch~2~f32~2x3x4x8,5x3x2x2,5~S3,R,R~stride=1~0]",
     "AssertionError: conv2d_patch: output 0: local shape", "2.15.0", CONV_ENTRY),
    ("suites/generators/ops_entry.py::test_op_case[conv2d_patch~2~f32~5x4x10,13x5x2x2,13~R,S1,S0~stride=2~840]",
     "RuntimeError: the op raised RuntimeError: Given groups=N, weight of size [N, N, N, N], expected input[N, N, N, N] "
     "to have N channels, but got N channels instead", "2.15.0", CONV_ENTRY),
    ("suites/generators/ops_entry.py::test_op_case[conv2d_patch~2~f32~2x3x4x8,5x3x2x2,5~S3,R,R~stride=1~0]",
     "AssertionError: conv2d_patch: output 0: local shape", "2.10.0", None),  # below the measured range (>=2.11)
    ("suites/regressions/test_pytorch191926_dtensor_conv2d_shard_width.py::test_conv2d_matches_the_plain_op"
     "[width_sharded_patch]", "AssertionError: conv2d of an input sharded on dim 3 (stride 2): the output's "
     "placements (Replicate(),) of (2, 5, 2, 4) say (2, 5, 2, 4), the rank holds (2, 5, 2, 2)", "2.13.0",
     "pytorch191926-dtensor-conv2d-shard-width"),
    ("suites/generators/models_entry.py::test_model_structure[fsdp-mtp-wrap_grouped]",
     "TypeError: Invariant encountered: value was None when it should not be", "2.13.0", GROUPED_ENTRY),
    ("suites/generators/models_entry.py::test_model_structure[fsdp-blocks2-tied-mtp-wrap_grouped-steps2]",
     "RuntimeError: Cannot concatenate overlapping meshes: [DeviceMesh((dp=2), 'cpu', stride=(1,))]", "2.15.0",
     GROUPED_ENTRY),
    ("suites/generators/models_entry.py::test_model_structure[fsdp-mtp]",
     "TypeError: Invariant encountered: value was None when it should not be", "2.13.0", None),
    # compile (reports/fuzz-models-2026-12-10-compile.md): pytorch184980's silent FSDP2 x TP face
    # and its raising TP face, the AC devicemesh entry (2.13 only), pytorch139989's eager fallback
    ("suites/generators/models_entry.py::test_model_structure[fsdp_tp-plan_titan-compile_blocks]",
     "AssertionError: the parameter gradient of tok.weight leaves the reference first (N problem(s))", "2.15.0",
     "pytorch184980-act-into-compiled-block"),
    ("suites/generators/models_entry.py::test_model_structure[tp-plan_titan-compile_blocks]",
     "AttributeError: 'Tensor' object has no attribute '_local_tensor'", "2.13.0",
     "pytorch184980-act-into-compiled-block"),
    ("suites/generators/models_entry.py::test_model_structure[fsdp_tp-plan_titan]",
     "AssertionError: the parameter gradient of tok.weight leaves the reference first (N problem(s))", "2.13.0",
     None),
    ("suites/generators/models_entry.py::test_model_structure[tp-ac_full-attn-compile_blocks]",
     "AssertionError: expected all tensors_saved_with_vc_check to be Tensors, got types", "2.13.0",
     "torch213-compile-ac-tp-devicemesh-saved"),
    ("suites/generators/models_entry.py::test_model_structure[fsdp-moe2-ac_full-compile_blocks]",
     "AssertionError: nothing was compiled: compile=blocks ran eager (N problem(s))", "2.15.0",
     "pytorch139989-graph-break-in-checkpoint-runs-eager"),
    ("suites/generators/models_entry.py::test_model_structure[fsdp-moe2-compile_blocks]",
     "AssertionError: nothing was compiled: compile=blocks ran eager (N problem(s))", "2.15.0", None),
])
def test_the_generators_finds_are_filed_under_the_registered_bug(test_id, signature, torch_version, entry):
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    assert registry.match(test_id, signature, "", Stack(torch=torch_version)) == entry


def test_an_in_place_refusal_on_a_partial_is_a_gap_not_a_find():
    """DTensor refuses `loss += x` when the loss is Partial and the sum would need another
    placement, and says what to do ("Please use the out-of-place version"): a named limit like
    "Please redistribute the input first", counted as a gap (pytorch#145218's face since 2.13)."""
    pytest.importorskip("torch")
    from distci.op_case import parse_case
    from suites.generators.ops_cases import CaseOutcome, _raised

    case = parse_case("loss_plus_aux~2~f32~4x3,4x2~S0,R~coef=0.01,inplace=1~0")
    exc = RuntimeError("aten.add_.Tensor: in-place operations that require placement changes are not supported. "
                       "The input has placement (Partial(sum),), but no valid strategy preserves this placement. "
                       "Please use the out-of-place version of this operation instead.")
    out = _raised(case, exc, "the op", lambda status, signature=None, message="": CaseOutcome(status, signature, message))
    assert out.status == "gap" and "refused" in out.signature
    backward = _raised(case, exc, "backward", lambda status, signature=None, message="": CaseOutcome(status, signature,
                                                                                                     message))
    assert backward.status == "fail"  # nobody can redistribute inside autograd
    # the same refusal inside an out-of-place op the caller cannot rewrite (F.rms_norm adds eps
    # in place to a Partial mean) is a find: dtensor-rms-norm-sharded-hidden was found this way
    norm = parse_case("rms_norm~2x2~f32~1x4,4~S1.S1,R.R~-~0")
    inside = _raised(norm, RuntimeError(str(exc).replace("aten.add_.Tensor", "aten.add_.Scalar")), "the op",
                     lambda status, signature=None, message="": CaseOutcome(status, signature, message))
    assert inside.status == "fail", inside
    # torch's own message, with its source line's indentation inside it (2.13.0)
    nll = parse_case("nll_log_softmax~2~bf16~5x1,5~S0,S0~-~443")
    biased = RuntimeError("The intermediate results of nll_loss cannot be evenly sharded,"
                          "                         resulting in biased mean result.")
    assert _raised(nll, biased, "the op",
                   lambda status, signature=None, message="": CaseOutcome(status, signature, message)).status == "gap"
    written_out_of_place = parse_case("loss_plus_aux~2~f32~4x3,4x2~S0,R~coef=0.01,inplace=0~0")
    assert _raised(written_out_of_place, exc, "the op",
                   lambda status, signature=None, message="": CaseOutcome(status, signature, message)).status == "fail"


# --- bounded runs: the generator finds the bug where the stack has it ---------------------------

def _cell() -> str:
    """This interpreter's cell: its torch release, fixes off (the 2.13.0 and 2.15.0 venvs)."""
    import torch

    version = torch.__version__.split("+")[0]
    return CELL if version == "2.13.0" else f"cpu-cpu-torch_{version}-ao_0.18.0-ws2-fix_off"


def _run_cases(tmp: Path, tests: list[str]) -> tuple[str, list[dict]]:
    """`python -m distci run` of these test ids on this interpreter's cell: its output and every
    Result it recorded."""
    from distci.harness import procs

    cmd = [sys.executable, "-m", "distci", "run", "--cell", _cell(), "--python", sys.executable,
           "--runs-root", str(tmp / "runs"), *(a for t in tests for a in ("--test", t))]
    child = procs.start_owned(cmd, env=dict(os.environ), token=procs.run_token(), death_signal=signal.SIGTERM,
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = child.communicate(timeout=900)
    finally:
        if child.poll() is None:
            procs.stop(child)
    results = [json.loads(line) for path in (tmp / "runs").glob("*/results.jsonl")
               for line in path.read_text().splitlines()]
    return out, results


def _applies(entry: str) -> bool:
    import torch

    registry = load_registry(REPO / "suites" / "known_issues.toml")
    spec = next(i for i in registry.entries if i.id == entry)
    return spec.applies_to(Stack(torch=torch.__version__.split("+")[0]))


OPS_ENTRY = "suites/generators/ops_entry.py"


def _conv_case():
    """Seed reach's first conv case on a 2-rank mesh, as `distci fuzz --generator ops --seed reach
    --ops conv2d_patch --meshes 2` draws it: sharded on the width, it meets CONV_ENTRY."""
    return draw_cases("reach", 0, 1, [BY_NAME["conv2d_patch"]], ["2"])[0]


@pytest.mark.slow
def test_a_bounded_ops_run_finds_the_conv_width_bug_and_files_it_known(bounded_cases_run):
    case = _conv_case()
    assert _width_sharded(case), case.id
    out, results = bounded_cases_run
    mine = [r for r in results if r["test_id"] == f"{OPS_ENTRY}::test_op_case[{case.id}]"]
    assert mine, out[-3000:]
    if _applies(CONV_ENTRY):
        assert mine[0]["outcome"] == "failed" and mine[0]["known_issue"] == CONV_ENTRY, (mine[0], out[-3000:])
    else:
        assert mine[0]["outcome"] != "failed", mine[0]


MODEL_SPACE = ["parallel=fsdp", "wrap=grouped", "mtp=true", "experts=0", "blocks=1",
               "seq=fixed", "pad=false", "loss=mean", "compile=none", "backend=aot_eager"]
"""The models generator's space of the bounded run: its seed's first draw meets GROUPED_ENTRY.
The later features written after it (sequences, padding, the loss, compile) are held at their
defaults, so the draw is the one this test was written on, whatever later features add."""


def _grouped_structure() -> str:
    return structure_key(Drawer("reach", parse_space(MODEL_SPACE)).draw())


@pytest.mark.slow
def test_a_bounded_models_run_finds_the_grouped_unit_bug_and_files_it_known(bounded_cases_run):
    out, results = bounded_cases_run
    structure = _grouped_structure()
    assert "wrap_grouped" in structure
    mine = [r for r in results if r["test_id"] == f"{MODELS_ENTRY}::{MODELS_TEST}[{structure}]"]
    assert mine, out[-3000:]
    if _applies(GROUPED_ENTRY):
        assert mine[0]["outcome"] == "failed" and mine[0]["known_issue"] == GROUPED_ENTRY, (mine[0], out[-3000:])
    else:
        assert mine[0]["outcome"] == "passed", mine[0]

# --- round 2, evening: the programs generator's forms (flattened optimizer checkpoints, FSDP2
# bf16/fp32, stateless SGD) reach pytorch#192202, #192225 and #186998 ---------------------------

FROZEN = "pytorch192202-dsd-optim-state-frozen-params"
FLAT = "pytorch192225-dsd-flat-stateless-empty-state"
FLAT_TYPEERROR = "pytorch192224-dsd-flat-missing-state-typeerror"
MP = "pytorch186998-fsdp2-mp-unfreeze-after-frozen-forward"


def _base(text: str) -> str:
    """A program's text with every form back to the value it is a form of."""
    program = parse_program(text)
    actions = tuple(tp.token(split(a)[0], pf.base_of(*split(a))) for a in program.actions)
    return tp.Program(pf.base_of("layout", program.layout), program.world_size, program.width,
                      program.layers, pf.base_of("optim", program.optim), actions).text


def test_the_programs_generator_draws_flattened_checkpoints_bf16_fsdp_and_stateless_sgd():
    programs = [draw("reach", i) for i in range(3000)]
    texts = [p.text for p in programs]
    assert any(p.layout == "fsdp_mp" for p in programs) and any(p.optim == "sgd0" for p in programs)
    flat = [p for p in programs if "save=flat" in p.actions and "load" in p.actions[p.actions.index("save=flat"):]]
    assert flat, texts[:20]
    assert any(p.optim == "sgd0" for p in flat)
    # freezing around a checkpoint and around a bf16 first forward, both in the space
    assert any(any(a.startswith("freeze=") for a in p.actions) and "load" in p.actions for p in programs)
    assert any(p.layout == "fsdp_mp" and any(a.startswith("unfreeze") for a in p.actions) for p in programs)
    assert all(tp.valid(p) for p in programs)


# What seed "night" (all layouts) and the optim_load_fsdp plant's seed (fsdp only) drew before the
# forms existed (main at c02896d): the plants' seeds were chosen on these draws
BEFORE_FORMS = {
    ("night", None): [
        "fsdp-ws4-w32-l2-sgd:step,fwd_bwd=nosync,fwd_bwd,eval,eval",
        "tp-ws4-w32-l2-adamw:sched,step,fwd_bwd,step,step,fwd_bwd,step",
        "tp-ws4-w8-l1-sgd:sched,save=full,eval,fwd_bwd,load,save=full,clip,zero_grad,step,zero_grad=zeros,save=full,step",
        "fsdp-ws4-w32-l1-sgd:reshard,save=full,step,fwd_bwd=nosync,fwd_bwd=nosync,fwd_bwd,step,clip=inf,clip,fwd_bwd,load",
        "ddp-ws2-w16-l1-adamw:fwd_bwd=nosync,fwd_bwd,step,eval=inference_mode,zero_grad,fwd_bwd,step,sched,zero_grad,"
        "fwd_bwd",
        "tp-ws2-w32-l2-adamw:step,step,sched,step,fwd_bwd,eval=inference_mode,step,step,step,metric,metric=barrier,"
        "metric,sched,lr",
    ],
    ("optim2549", ("fsdp",)): [
        "fsdp-ws2-w32-l2-sgd:fwd_bwd=nosync,fwd_bwd=nosync,fwd_bwd=nosync,fwd_bwd,step,save=full,step,metric,step,load",
        "fsdp-ws4-w8-l2-adamw:zero_grad=zeros,step,new_optim,step,sched,new_optim,sched,freeze=head",
        "fsdp-ws4-w16-l3-sgd:fwd_bwd=nosync,fwd_bwd,fwd_bwd=nosync,fwd_bwd,fwd_bwd,metric",
        "fsdp-ws4-w32-l3-sgd:zero_grad=zeros,freeze=head,zero_grad,save=full,sched",
    ],
}


def test_forms_never_move_what_a_seed_drew_before_them():
    """Forms come from their own stream: with every form taken back to its value, a seed draws
    exactly the programs it drew before the forms existed (plants' seeds, replayed nights)."""
    for (seed, layouts), before in BEFORE_FORMS.items():
        widened = [draw(seed, i, *(layouts,) if layouts else ()).text for i in range(len(before))]
        assert [_base(t) for t in widened] == before
    assert any(draw("night", i).text != BEFORE_FORMS[("night", None)][i] for i in range(6))  # and forms are drawn


# What seed "night" drew with round 1's later forms, before round 2's existed (main at 197fae9):
# round 2 comes from a stream of its own, so round 1's picks stay put
BEFORE_ROUND_2 = [
    "fsdp_mp-ws4-w32-l2-sgd0:step,fwd_bwd=nosync,fwd_bwd,eval,eval",
    "tp-ws4-w32-l2-adamw:sched,step,fwd_bwd,step,step,fwd_bwd=twice,step",
    "tp-ws4-w8-l1-sgd0:sched,save=full,eval,fwd_bwd=twice,load,save=full,clip=value,zero_grad,step,zero_grad=zeros,"
    "save=full,step",
    "fsdp-ws4-w32-l1-sgd:reshard,save=full,step,fwd_bwd=nosync,fwd_bwd=nosync,fwd_bwd,step,clip=inf,clip,"
    "fwd_bwd=twice,load",
]


UP_TO_AMP = ("later", "later2", "later3", "later_reshard", "later_optim", "later_amp")
"""The later rounds these texts were checked with: a round after them (later_hook's inbwd drops
the gradients a later precondition reads) may draw other actions after its first form."""


def _base_round_2(text: str, tables: tuple = (pf.LATER_FORMS_2, pf.LATER_FORMS_3, pf.LATER_FORMS_OPTIM)) -> str:
    """A program's text with the later forms of `tables` (round 2's and after) back to their values."""
    program = parse_program(text)
    back = {(w, f): v for table in tables for (w, v), fs in table.items() for f in fs}
    actions = tuple(tp.token(split(a)[0], back.get(split(a), split(a)[1])) for a in program.actions)
    return tp.Program(back.get(("layout", program.layout), program.layout), program.world_size, program.width,
                      program.layers, back.get(("optim", program.optim), program.optim), actions).text


def test_round_2_forms_never_move_round_1s_picks():
    widened = [draw("night", i, rounds=UP_TO_AMP).text for i in range(len(BEFORE_ROUND_2))]
    assert [_base_round_2(t) for t in widened] == BEFORE_ROUND_2
    assert widened != BEFORE_ROUND_2  # and round 2's forms are drawn (eval=generate, load=model here)


def test_round_2_forms_are_drawn_where_their_calls_are_made():
    programs = [draw("reach2", i) for i in range(1500)]
    drawn = {a for p in programs for a in p.actions} | {p.layout for p in programs}
    wanted = {"hsdp", "fwd_bwd=noreduce", "reshard=forward_false", "reshard=unshard", "reshard=prefetch",
              "reshard=divide", "eval=generate", "load=model", "compile=blocks"}
    assert wanted <= drawn, wanted - drawn
    assert all(p.world_size == 4 for p in programs if p.layout == "hsdp")
    assert all(tp.AMP.get(layout, layout) == "hsdp" for p in programs for tok, layout in _layouts(p)
               if tok == "fwd_bwd=noreduce")
    assert all(tp.valid(p) for p in programs)


def _layouts(program) -> list[tuple[str, str]]:
    """(action, the layout it runs under): the program's own until a `load=LAYOUT`
    (round later_reshard)."""
    state, out = tp.State(layout=program.layout, world_size=program.world_size), []
    for tok in program.actions:
        out.append((tok, state.layout))
        state = tp.action(split(tok)[0]).effect(state, split(tok)[1])
    return out


# What seed "night" drew with rounds 1 and 2, before round 3 (float8) existed (main at d2986d5)
BEFORE_ROUND_3 = [
    "fsdp_mp-ws4-w32-l2-sgd0:step,fwd_bwd=nosync,fwd_bwd,eval=generate,eval",
    "tp-ws4-w32-l2-adamw:sched,step,fwd_bwd,step,step,fwd_bwd=twice,step",
    "tp-ws4-w8-l1-sgd0:sched,save=full,eval=generate,fwd_bwd=twice,load=model,save=full,clip=value,zero_grad,step,"
    "zero_grad=zeros,save=full,step",
    "fsdp-ws4-w32-l1-sgd:reshard,save=full,step,fwd_bwd=nosync,fwd_bwd=nosync,fwd_bwd,step,clip=inf,clip,"
    "fwd_bwd=twice,load=model",
    "ddp-ws2-w16-l1-adamw_groups:fwd_bwd=nosync,fwd_bwd,step,eval=inference_mode,zero_grad,fwd_bwd,step,sched,"
    "zero_grad,fwd_bwd",
]


def test_round_3_forms_never_move_earlier_rounds_picks():
    widened = [draw("night", i, rounds=UP_TO_AMP).text for i in range(len(BEFORE_ROUND_3))]
    assert [_base_round_2(t, (pf.LATER_FORMS_3, pf.LATER_FORMS_OPTIM)) for t in widened] == BEFORE_ROUND_3
    assert widened[3].startswith("fsdp_f8-") and "step=precompute" in widened[3]  # and round 3 is drawn


# What seed "night" drew with rounds 1 to 3, before the optimizers round existed (main at 78a2e89)
BEFORE_ROUND_OPTIM = [
    "fsdp_mp-ws4-w32-l2-sgd0:step,fwd_bwd=nosync,fwd_bwd,eval=generate,eval",
    "tp_f8-ws4-w32-l2-adamw:sched,step,fwd_bwd,step,step,fwd_bwd=twice,step",
    "tp_f8-ws4-w8-l1-sgd0:sched,save=full,eval=generate,fwd_bwd=twice,load=model,save=full,clip=value,zero_grad,step,"
    "zero_grad=zeros,save=full,step",
    "fsdp_f8-ws4-w32-l1-sgd:reshard,save=full,step=precompute,fwd_bwd=nosync,fwd_bwd=nosync,fwd_bwd,step=precompute,"
    "clip=inf,clip,fwd_bwd=twice,load=model",
    "ddp-ws2-w16-l1-adamw_groups:fwd_bwd=nosync,fwd_bwd,step,eval=inference_mode,zero_grad,fwd_bwd,step,sched,"
    "zero_grad,fwd_bwd",
    "tp-ws2-w32-l2-adamw_groups:step,step,sched,step,fwd_bwd,eval=inference_mode,step,step,step,metric,"
    "metric=barrier,metric,sched,lr",
    "ddp-ws2-w16-l2-adamw:fwd_bwd=twice,freeze=head,zero_grad,unfreeze=head,sched,fwd_bwd=nosync,fwd_bwd,"
    "eval=inference_mode",
]


def test_the_optimizers_round_never_moves_earlier_rounds_picks():
    # the round changes a program's optimizer and nothing else: its stream is consulted only for a
    # plain adamw / sgd, after every earlier round left it plain (program_forms.LATER_ROUNDS)
    widened = [draw("night", i, rounds=UP_TO_AMP).text for i in range(len(BEFORE_ROUND_OPTIM))]
    assert [_base_round_2(t, (pf.LATER_FORMS_OPTIM,)) for t in widened] == BEFORE_ROUND_OPTIM
    assert [draw("night", i, rounds=("later", "later2", "later3")).text
            for i in range(len(BEFORE_ROUND_OPTIM))] == BEFORE_ROUND_OPTIM
    moved = [(a, b) for a, b in zip(widened, BEFORE_ROUND_OPTIM) if parse_program(a).optim != parse_program(b).optim]
    assert [parse_program(a).optim for a, _ in moved] == ["radam", "rmsprop", "adafactor"]  # and it is drawn


def test_the_optimizers_round_draws_every_form_on_every_layout_family():
    programs = [draw("reach_optim", i) for i in range(1500)]
    forms = {f for fs in pf.LATER_FORMS_OPTIM.values() for f in fs}
    assert forms <= {p.optim for p in programs}, forms - {p.optim for p in programs}
    for form in forms:  # sharded (FSDP2, TP) and replicated (DDP) alike
        layouts = {p.layout for p in programs if p.optim == form}
        assert layouts & set(tp.FSDP) and layouts & {"tp", "tp_f8", "fsdp_tp"} and "ddp" in layouts, (form, layouts)
    assert all(tp.valid(p) for p in programs)
    assert {pf.base_of("optim", f) for f in forms} == {"adamw", "sgd"}  # forms, never new base values


def test_a_seed_drawn_with_fewer_rounds_is_the_seed_before_the_later_rounds_existed():
    # `draw(..., rounds=NAMES)` (`distci fuzz --rounds NAMES`) replays what a seed drew when only
    # those later rounds existed: round 3's texts above with rounds 1 and 2; any other round's
    # forms left out, whatever order the rounds are listed in
    assert [draw("night", i, rounds=("later", "later2")).text for i in range(len(BEFORE_ROUND_3))] == BEFORE_ROUND_3
    every = tuple(stream for stream, _, _ in pf.LATER_ROUNDS)
    assert [draw("night", i, rounds=every[::-1]).text for i in range(8)] == [draw("night", i).text for i in range(8)]
    for k in range(len(every)):
        left_out = {(w, f) for _, table, _ in pf.LATER_ROUNDS[k:] for (w, _v), fs in table.items() for f in fs}
        for i in range(200):
            program = draw("rounds", i, rounds=every[:k])
            used = {split(a) for a in program.actions} | {("layout", program.layout)}
            assert not used & left_out, (k, program.text)


def test_round_3_forms_are_drawn_where_their_calls_are_made():
    programs = [draw("reach3", i) for i in range(1500)]
    assert {"fsdp_f8"} <= {p.layout for p in programs}
    precomputing = [p for p in programs if "step=precompute" in p.actions]
    assert precomputing and all(p.layout in tp.FLOAT8 for p in precomputing)
    assert all(tp.valid(p) for p in programs)
    only = [draw("f8", i, ("fsdp_f8",)) for i in range(40)]
    assert {p.layout for p in only} == {"fsdp_f8"} and any("step=precompute" in p.actions for p in only)


_NAMES = [stream for stream, _, _ in pf.LATER_ROUNDS]
BEFORE_RESHARD = tuple(_NAMES[:_NAMES.index("later_reshard")])
"""The later rounds before round later_reshard (its restarts consulted only where they left a
plain `load`)."""
RESTARTS = set(pf.LATER_FORMS_RESHARD[("load", "")])


def test_round_later_reshard_leaves_every_program_as_it_was_up_to_its_first_restart():
    """Round later_reshard (load=LAYOUT, load=file) draws from a stream of its own: a program
    is drawn as before it up to its first restart, which was a plain `load` there; only the
    actions after a restart may differ (drawn where the new layout allows them, with no
    gradients held), and the restart forms are drawn."""
    changed = 0
    for i in range(300):
        old = draw("night", i, rounds=BEFORE_RESHARD)
        new = draw("night", i, rounds=BEFORE_RESHARD + ("later_reshard",))
        first = next((k for k, a in enumerate(new.actions) if split(a)[0] == "load" and split(a)[1] in RESTARTS),
                     len(new.actions))
        assert new.text.partition(":")[0] == old.text.partition(":")[0]
        assert new.actions[:first] == old.actions[:first], (old.text, new.text)
        if first < len(new.actions):
            assert old.actions[first] == "load", (old.text, new.text)
            changed += 1
        else:
            assert new == old
    assert changed >= 10


def test_round_later_reshard_forms_are_drawn_where_their_calls_are_made():
    programs = [draw("reach_rs", i) for i in range(1500)]
    assert {f"load={x}" for x in RESTARTS} <= {a for p in programs for a in p.actions}
    for p in programs:
        steps = _layouts(p)
        for (tok, layout), (_, after) in zip(steps, steps[1:] + [("", "")]):
            if split(tok)[0] == "load" and split(tok)[1] in tp.LAYOUTS:  # another layout these ranks run
                assert split(tok)[1] != layout and p.world_size in tp.LAYOUTS[split(tok)[1]], p.text
                assert layout not in tp.FLOAT8, p.text  # a float8 model stays float8
                assert after in ("", split(tok)[1]), p.text  # and the program goes on under it
    assert all(tp.valid(p) for p in programs)
    only = [draw("reach_rs", i, ("fsdp_f8",)) for i in range(200)]
    assert "load=file" in {a for p in only for a in p.actions}
    assert not {a for p in only for a in p.actions} & {f"load={x}" for x in tp.RELAYOUTS}


@pytest.mark.parametrize("layout", ["fsdp", "tp", "fsdp_mp", "hsdp"])
def test_precompute_is_a_float8_layouts_call_only(layout):
    ws = tp.LAYOUTS[layout][0]
    parse_program(f"{layout}-ws{ws}-w8-l1-sgd:fwd_bwd,step")
    with pytest.raises(tp.ProgramError, match="not where a loop makes it"):
        parse_program(f"{layout}-ws{ws}-w8-l1-sgd:fwd_bwd,step=precompute")
    parse_program("fsdp_f8-ws2-w8-l1-sgd:fwd_bwd,step=precompute")


STALE_SCALE, INFERENCE_F8 = "distci-float8-precomputed-scale-after-load", "pytorch170419-float8-fsdp2-inference-mode"


@pytest.mark.parametrize("program, signature, entry", [
    ("fsdp_f8-ws2-w16-l2-adamw:fwd_bwd,step=precompute,fwd_bwd,step,save,fwd_bwd,step,load,fwd_bwd",
     "AssertionError: at action fwd_bwd: blocks.N.norm.bias: gradient SQNR N dB < N dB (N problem(s))", STALE_SCALE),
    ("fsdp_f8-ws2-w8-l1-sgd:step=precompute,save,fwd_bwd,step,load,eval",
     "AssertionError: at action eval: loss N vs reference N (|diff| N > N + N*|ref|) (N problem(s))", STALE_SCALE),
    ("fsdp_f8-ws2-w8-l1-sgd:eval=inference_mode", "RuntimeError: Cannot set version_counter for inference tensor",
     INFERENCE_F8),
    # whole-model compile around the root's buffer bump, as under tp (compile=blocks is not it)
    ("tp_f8-ws2-w16-l1-sgd:fwd_bwd,compile,fwd_bwd,step,fwd_bwd",
     "AssertionError: at action fwd_bwd: blocks.N.norm.bias: gradient SQNR N dB < N dB (N problem(s))",
     "pytorch197039-compile-recomputes-mutated-buffer"),
    # without a precomputing step there is no cached scale: a numeric failure there is not this bug
    ("fsdp_f8-ws2-w8-l1-sgd:fwd_bwd,step,save,fwd_bwd,step,load,fwd_bwd",
     "AssertionError: at action fwd_bwd: blocks.N.norm.bias: gradient SQNR N dB < N dB (N problem(s))", None),
])
def test_the_float8_programs_finds_file_under_their_registered_bug(program, signature, entry):
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    test_id = f"suites/generators/programs_entry.py::test_program[{program}]"
    assert registry.match(test_id, signature, "", Stack(torch="2.13.0", torchao="0.18.0")) == entry


def test_the_float8_round_draws_the_stale_scale_shape():
    """A precomputing step, a step that moves the weights after a save, the load, then a forward:
    what distci-float8-precomputed-scale-after-load needs, drawn by the restricted run's seed."""
    def shape(p: tp.Program) -> bool:
        names = [split(a) for a in p.actions]
        first = next((i for i, a in enumerate(names) if a == ("step", "precompute")), None)
        loads = [i for i, (n, _) in enumerate(names) if n == "load" and first is not None and i > first]
        return any(n in ("fwd_bwd", "eval") for n, _ in names[loads[0] + 1:]) if loads else False
    assert any(shape(draw("2026-12-07-f8", i, ("fsdp_f8",))) for i in range(200))


def test_a_restricted_layout_draws_only_what_it_names():
    assert {draw("only", i, ("fsdp",)).layout for i in range(50)} == {"fsdp"}
    assert {draw("only", i, ("fsdp_mp",)).layout for i in range(50)} == {"fsdp_mp"}


def test_a_form_shrinks_to_its_plain_value():
    program = parse_program("fsdp_mp-ws4-w8-l1-sgd0:fwd_bwd,step,save=flat,load")
    shrunk = {e.apply(program).text for e in edits(program)}
    assert "fsdp-ws2-w8-l1-sgd0:fwd_bwd,step,save=flat,load" in shrunk
    assert "fsdp_mp-ws4-w8-l1-sgd:fwd_bwd,step,save=flat,load" in shrunk
    assert "fsdp_mp-ws4-w8-l1-sgd0:fwd_bwd,step,save,load" in shrunk


@pytest.mark.parametrize("program, signature, torch_version, entry", [
    ("fsdp-ws2-w8-l1-adamw:fwd_bwd,step,freeze=head,save,load",
     "AssertionError: at action load: optimizer state: entries missing from the run (exp_avg, exp_avg_sq, step; "
     "first exp_avg of head.bias) (N problem(s))", "2.13.0", FROZEN),
    ("fsdp-ws2-w8-l1-adamw:fwd_bwd,step,freeze,save,load",  # block0's freeze is the plain token
     "AssertionError: at action load: optimizer state: entries missing from the run (exp_avg, exp_avg_sq, step; "
     "first exp_avg of blocks.0.norm.bias) (N problem(s))", "2.13.0", FROZEN),
    ("fsdp-ws2-w8-l1-adamw:freeze=head,fwd_bwd,step,unfreeze=head,save,load",
     "RuntimeError: Missing optimizer state for parameter 'head.weight' in checkpoint. The parameter requires "
     "gradients but has no saved optimizer state. To load anyway, use StateDictOptions(strict=False).", "2.15.0",
     FROZEN),
    ("fsdp-ws2-w8-l1-sgd0:fwd_bwd,step,save=flat,load",
     "AssertionError: at action load: optimizer state: entries the reference lacks ((empty); first (empty) of "
     "blocks.0.norm.bias) (N problem(s))", "2.15.0", FLAT),
    ("fsdp-ws2-w8-l1-adamw:freeze=head,fwd_bwd,step,unfreeze=head,save=flat,new_optim,load",
     "AssertionError: at action load: optimizer state: entries the reference lacks ((empty); first (empty) of "
     "blocks.0.norm.bias) (N problem(s))", "2.13.0", FLAT),
    ("fsdp_mp-ws2-w8-l1-sgd:freeze=block0,fwd_bwd,unfreeze=block0,fwd_bwd",
     "RuntimeError: attempting to assign a gradient with dtype 'c10::BFloat16' to a tensor with grad_dtype 'Float'. "
     "The gradient must match the tensor's grad_dtype", "2.13.0", MP),
    # 2.15.0 carries the fix: the same failure there is no longer this entry's
    ("fsdp_mp-ws2-w8-l1-sgd:freeze=block0,fwd_bwd,unfreeze=block0,fwd_bwd",
     "RuntimeError: attempting to assign a gradient with dtype 'c10::BFloat16' to a tensor with grad_dtype 'Float'. "
     "The gradient must match the tensor's grad_dtype", "2.15.0", None),
    # a full state dict keeps a frozen parameter's state: not this entry's test
    ("fsdp-ws2-w8-l1-adamw:fwd_bwd,step,freeze=head,save=full,load",
     "AssertionError: at action load: optimizer state: entries missing from the run (exp_avg; first exp_avg of head.bias)",
     "2.13.0", None),
    # round later_reshard: a restart under another layout meets the flattened stateless round trip alike
    ("fsdp-ws2-w8-l1-sgd0:fwd_bwd,step,save=flat,load=tp",
     "AssertionError: at action load=tp: optimizer state: entries the reference lacks ((empty); first (empty) of "
     "blocks.0.norm.bias) (N problem(s))", "2.13.0", FLAT),
    # round later_reshard: a flattened save through one file, loaded as full state dicts
    ("fsdp-ws2-w8-l1-adamw:fwd_bwd,step,save=flat,fwd_bwd,step,load=file",
     "KeyError: 'state'", "2.13.0", "dsd-flat-full-optim-load"),
    ("fsdp-ws2-w8-l1-adamw:fwd_bwd,step,save=flat,fwd_bwd,step,load=file",
     "KeyError: 'param_groups'", "2.15.0", "dsd-flat-full-optim-load"),
    # the nested save through one file loads: a KeyError there is no entry's
    ("fsdp-ws2-w8-l1-adamw:fwd_bwd,step,save,fwd_bwd,step,load=file", "KeyError: 'state'", "2.13.0", None),
    # a flattened save before the first step meets pytorch#164929's hidden step, as the nested one does
    ("fsdp-ws2-w8-l1-adamw:fwd_bwd=nosync,fwd_bwd,zero_grad,save=flat",
     "AssertionError: at action save=flat: optimizer state: entries the reference lacks (exp_avg, exp_avg_sq, step; "
     "first exp_avg of blocks.0.norm.bias) (N problem(s))", "2.13.0", None),
])
def test_the_programs_finds_file_under_their_registered_bug(program, signature, torch_version, entry):
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    test_id = f"suites/generators/programs_entry.py::test_program[{program}]"
    assert registry.match(test_id, signature, "", Stack(torch=torch_version)) == entry


def test_the_hidden_step_entry_names_a_flattened_save_as_its_near_miss():
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    test_id = "suites/generators/programs_entry.py::test_program[fsdp-ws2-w8-l1-adamw:fwd_bwd,zero_grad,save=flat]"
    signature = ("AssertionError: at action save=flat: optimizer state: entries the reference lacks (exp_avg, "
                 "exp_avg_sq, step; first exp_avg of blocks.0.norm.bias) (N problem(s))")
    near = registry.near_misses(test_id, signature, "", Stack(torch="2.13.0"))
    assert "pytorch164929-dsd-get-optimizer-state-steps" in near


def test_the_hidden_step_entry_names_a_restarts_load_as_its_near_miss():
    """A restart (round later_reshard) loads into a fresh optimizer with no gradients: a full
    checkpoint taken before the first step meets pytorch#164929's load face there (found by the
    seeded run 2026-12-08-rs, 2.13.0; its plain-load twin `fwd_bwd,save=full,zero_grad,load`
    fails with the same line, and a step before the save passes)."""
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    program = "fsdp-ws4-w8-l1-sgd:fwd_bwd,save=full,load=fsdp_tp"
    test_id = f"suites/generators/programs_entry.py::test_program[{program}]"
    signature = ("AssertionError: at action load=fsdp_tp: optimizer state: entries the reference lacks "
                 "(momentum_buffer; first momentum_buffer of blocks.0.norm.bias) (N problem(s))")
    assert "pytorch164929-dsd-get-optimizer-state-steps" in registry.near_misses(test_id, signature, "",
                                                                                 Stack(torch="2.13.0"))
    missing = signature.replace("entries the reference lacks", "entries missing from the run")
    assert "pytorch164929-dsd-get-optimizer-state-steps" not in registry.near_misses(test_id, missing, "",
                                                                                     Stack(torch="2.13.0"))


# seed -> (layouts, the entry its first programs meet, the drawn program that meets it): chosen with
# the seeded draw alone (`python -m distci fuzz --generator programs --list --seed S --layout L`);
# reach3543 (program 0, 2 ranks) replaced reach1145 (program 3, after two 4-rank programs: a second
# pool and three programs nobody looks at); reach1366 replaced reach3543 when the round-2 forms
# (program_forms.LATER_FORMS_2) turned its last `load` into `load=model`, a model-only load
SEEDED_ROUNDS = ("later", "later2", "later3")
"""The later rounds BOUNDED's seeds were chosen with: a round added after them turned
reach13716's last `load` into a restart (load=ddp), so they are drawn as then (`--rounds`)."""
BOUNDED = {
    "reach13716": ("fsdp", FROZEN, "fsdp-ws2-w16-l1-adamw:fwd_bwd,sched,fwd_bwd,step,zero_grad,zero_grad,zero_grad,"
                                   "freeze=head,zero_grad=zeros,save=flat,step,zero_grad=zeros,load"),
    "reach1366": ("fsdp", FLAT, "fsdp-ws2-w32-l2-sgd0:step,save=flat,load,zero_grad,step"),
    "reach1021": ("fsdp_mp", MP, "fsdp_mp-ws2-w16-l3-sgd:freeze,fwd_bwd,new_optim,step,fwd_bwd,new_optim,sched,step,"
                                 "zero_grad,unfreeze,fwd_bwd,save"),
}


@pytest.fixture(scope="module")
def bounded_cases_run(tmp_path_factory) -> tuple[str, list[dict]]:
    """What the bounded draws reach (the three programs of BOUNDED, the models space's first
    structure, seed reach's first conv case), run as the cell runs them: one `python -m distci
    run` of their test ids, so one pytest session and one 2-rank pool serve the five cases. Each
    test proves its seed draws the case (the generators' own draw functions, which their fuzz
    runs and `--list` draw through: tests/test_fuzz_programs.py, test_fuzz_models.py,
    test_fuzz_ops.py) and reads the case's Result: failed and filed under its registered entry
    where the entry applies to this stack. A `distci fuzz` run per seed started a controller, a
    session and a pool for one case; what it adds around the case (drawing, batches or sweeps,
    shrinking) is not what these tests look at."""
    pytest.importorskip("torch")
    tests = [f"{tp.ENTRY_TEST}::{tp.TEST_NAME}[{program}]" for _, _, program in BOUNDED.values()]
    tests.append(f"{MODELS_ENTRY}::{MODELS_TEST}[{_grouped_structure()}]")
    tests.append(f"{OPS_ENTRY}::test_op_case[{_conv_case().id}]")
    return _run_cases(tmp_path_factory.mktemp("bounded"), tests)


@pytest.mark.slow
@pytest.mark.parametrize("seed", list(BOUNDED))
def test_a_bounded_programs_run_finds_the_bug_and_files_it_known(bounded_cases_run, seed):
    layouts, entry, program = BOUNDED[seed]
    drawn = [draw(seed, i, (layouts,), rounds=SEEDED_ROUNDS).text for i in range(4)]
    assert program in drawn
    out, results = bounded_cases_run
    mine = [r for r in results if r["test_id"].endswith(f"[{program}]")]
    assert mine, out[-3000:]
    if _applies(entry):
        assert mine[0]["outcome"] == "failed" and mine[0]["known_issue"] == entry, (mine[0], out[-3000:])
    else:
        assert mine[0]["known_issue"] != entry, mine[0]


@pytest.mark.parametrize("program, signature, entry", [
    ("fsdp-ws2-w8-l1-adafactor:fwd_bwd,step",
     "RuntimeError: aten.pow_.Scalar: in-place operations that require placement changes are not supported. The "
     "input has placement (_NormPartial(N),), but no valid strategy preserves this placement.",
     "dtensor-adafactor-sharded-matrix"),
    ("hsdp-ws4-w8-l1-adafactor:fwd_bwd,step",  # a replicated axis before the partial one
     "RuntimeError: aten.pow_.Scalar: in-place operations that require placement changes are not supported. The "
     "input has placement (Replicate(), _NormPartial(N)), but no valid strategy preserves this placement.",
     "dtensor-adafactor-sharded-matrix"),
    ("tp-ws2-w8-l1-adamw_fused:fwd_bwd,step",
     "RuntimeError: aten._fused_adamw_.default got mixed torch.Tensor and DTensor, need to convert all "
     "torch.Tensor to DTensor before calling distributed operators!", "torchtune2501-tp-fused-optimizer-mixed"),
    ("tp-ws2-w8-l1-adamw_foreach:fwd_bwd,step",
     "RuntimeError: aten._foreach_mul_.Scalar got mixed torch.Tensor and DTensor, need to convert all "
     "torch.Tensor to DTensor before calling distributed operators!", "torchtune2501-tp-fused-optimizer-mixed"),
    # the for-loop optimizers under tp meet the clip's face only, which is not this entry's
    ("tp-ws2-w8-l1-adam:fwd_bwd,clip,step",
     "RuntimeError: aten._foreach_norm.Scalar got mixed torch.Tensor and DTensor, need to convert all "
     "torch.Tensor to DTensor before calling distributed operators!", None),
])
def test_the_optimizers_round_finds_file_under_their_registered_bug(program, signature, entry):
    _files_under(program, signature, entry)


def _files_under(program: str, signature: str, entry: str | None) -> None:
    """A program's failure with `signature` files under `entry` on 2.13.0 (and 2.15.0 if any)."""
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    test_id = f"suites/generators/programs_entry.py::test_program[{program}]"
    assert registry.match(test_id, signature, "", Stack(torch="2.13.0")) == entry
    assert entry is None or registry.match(test_id, signature, "", Stack(torch="2.15.0")) == entry
AMP_ROUNDS = tuple(stream for stream, _, _ in pf.LATER_ROUNDS[:[s for s, _, _ in pf.LATER_ROUNDS].index("later_amp")])
"""The rounds before the loss-scaling one (program_forms.LATER_FORMS_AMP): a round after it may
take the value it leaves plain (later_ac checkpoints a ddp the loss-scaling round leaves alone)."""


def _without_amp(text: str) -> str:
    """A program's text with the loss-scaling round's forms back to their values."""
    return _base_round_2(text, (pf.LATER_FORMS_AMP,))


def test_the_loss_scaling_round_never_moves_earlier_rounds_picks():
    """A program whose layout the round leaves alone is drawn as before it, save its spikes (a
    form of a sync backward, on LAYOUT_amp only: none here); one it gives a scaler keeps its
    head (sizes, optimizer, world size), the layout back to its value."""
    for i in range(300):
        before, after = draw("amp-moves", i, rounds=AMP_ROUNDS), draw("amp-moves", i, rounds=AMP_ROUNDS + ("later_amp",))
        if after.layout not in tp.AMP:
            assert after.text == before.text, (i, after.text)
        else:
            head = parse_program(_without_amp(after.text))
            assert (head.layout, head.world_size, head.width, head.layers, head.optim) == \
                (before.layout, before.world_size, before.width, before.layers, before.optim)


def test_the_loss_scaling_round_is_drawn_where_its_calls_are_made():
    programs = [draw("reach-amp", i) for i in range(1500)]
    assert set(tp.AMP) - {"hsdp_amp"} <= {p.layout for p in programs}  # hsdp_amp: ~1 in 500 (below)
    for form in ("fwd_bwd=spike", "fwd_bwd=badlabel"):
        spiked = [p for p in programs if form in p.actions]
        assert spiked and all(p.layout in tp.AMP for p in spiked), form
    assert all(tp.valid(p) for p in programs)
    only = [draw("amp", i, tuple(tp.AMP)) for i in range(60)]
    assert {p.layout for p in only} == set(tp.AMP)
    assert all(p.world_size == 4 for p in only if p.layout in ("hsdp_amp", "fsdp_tp_amp"))
    assert any("fwd_bwd=spike" in p.actions for p in only) and any("fwd_bwd=badlabel" in p.actions for p in only)


@pytest.mark.parametrize("form", ["spike", "badlabel"])
@pytest.mark.parametrize("layout", ["fsdp", "tp", "ddp", "hsdp", "fsdp_mp"])
def test_an_overflowing_backward_is_a_loss_scaled_layouts_call_only(layout, form):
    ws = tp.LAYOUTS[layout][0]
    parse_program(f"{layout}-ws{ws}-w8-l1-sgd:fwd_bwd,step")
    with pytest.raises(tp.ProgramError, match="not where a loop makes it"):
        parse_program(f"{layout}-ws{ws}-w8-l1-sgd:fwd_bwd={form},step")
    if f"{layout}_amp" in tp.AMP:
        parse_program(f"{layout}_amp-ws{ws}-w8-l1-sgd:fwd_bwd={form},step")


def test_a_loss_scaled_step_needs_a_gradient_to_unscale():
    parse_program("ddp-ws2-w8-l1-sgd:step")
    with pytest.raises(tp.ProgramError, match="not where a loop makes it"):
        parse_program("ddp_amp-ws2-w8-l1-sgd:step")
    with pytest.raises(tp.ProgramError, match="not where a loop makes it"):
        parse_program("ddp_amp-ws2-w8-l1-sgd:fwd_bwd,step,zero_grad,step")


def test_a_loss_scaled_layout_shrinks_to_its_plain_one():
    program = parse_program("fsdp_tp_amp-ws4-w8-l1-sgd:fwd_bwd,step,save,load")
    shrunk = {e.apply(program).text for e in edits(program)}
    assert {"fsdp_tp-ws4-w8-l1-sgd:fwd_bwd,step,save,load", "fsdp_amp-ws2-w8-l1-sgd:fwd_bwd,step,save,load"} <= shrunk


@pytest.mark.parametrize("program, signature, entry", [
    ("tp_amp-ws2-w8-l1-sgd:fwd_bwd,step",
     "RuntimeError: aten._amp_foreach_non_finite_check_and_unscale_.default: got mixed torch.Tensor and DTensor, "
     "need to convert all torch.Tensor to DTensor before calling distributed operators!", "dtensor-grad-scaler-mixed-dtensor"),
    # the plain tp layout does not unscale: not this entry's test
    ("tp-ws2-w8-l1-sgd:fwd_bwd,clip=value",
     "RuntimeError: aten._amp_foreach_non_finite_check_and_unscale_.default: got mixed torch.Tensor and DTensor",
     None),
])
def test_the_loss_scaling_finds_file_under_their_registered_bug(program, signature, entry):
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    test_id = f"suites/generators/programs_entry.py::test_program[{program}]"
    assert registry.match(test_id, signature, "", Stack(torch="2.13.0")) == entry


HOOK_ROUNDS = tuple(stream for stream, _, _ in pf.LATER_ROUNDS if stream != "later_hook")
"""Every round but later_hook (program_forms.LATER_FORMS_HOOK)."""
HOOK_FORMS = {("step", "ema"), ("eval", "ema"), ("clip", "total_norm"), ("clip", "foreach"), ("fwd_bwd", "inbwd")}


def test_the_hook_round_never_moves_earlier_rounds_picks():
    """The round's stream is consulted only where every earlier round left a value plain: a program
    is drawn as before it, its forms back to their values, up to its first fwd_bwd=inbwd (which
    leaves no gradient, so the draws after it may be others), and the round's forms are drawn."""
    back = {(w, f): v for (w, v), fs in pf.LATER_FORMS_HOOK.items() for f in fs}
    moved = 0
    for i in range(300):
        before, after = draw("hook-moves", i, rounds=HOOK_ROUNDS), draw("hook-moves", i)
        assert after.text.partition(":")[0] == before.text.partition(":")[0]
        first = next((k for k, a in enumerate(after.actions) if a == "fwd_bwd=inbwd"), len(after.actions))
        plain = [tp.token(split(a)[0], back.get(split(a), split(a)[1])) for a in after.actions[:first]]
        assert plain == list(before.actions[:first]), (before.text, after.text)
        if first < len(after.actions):
            assert before.actions[first] == "fwd_bwd", (before.text, after.text)
        else:
            assert len(after.actions) == len(before.actions)
        moved += after.text != before.text
    assert moved >= 60


def test_the_hook_round_is_drawn_where_its_calls_are_made():
    programs = [draw("reach-hook", i) for i in range(1500)]
    used = {split(a) for p in programs for a in p.actions}
    assert HOOK_FORMS <= used, HOOK_FORMS - used
    for p in programs:
        state = tp.State(layout=p.layout, world_size=p.world_size)
        for tok in p.actions:
            name, arg = split(tok)
            if (name, arg) == ("fwd_bwd", "inbwd"):  # a hook that sees the reduced gradient, none held before
                assert state.layout in tp.IN_BACKWARD and not state.grads, p.text
            if (name, arg) == ("eval", "ema"):  # an EMA a step made, not dropped by a restart since
                assert state.averaged, p.text
            state = tp.action(name).effect(state, arg)
    assert all(tp.valid(p) for p in programs)
    assert {pf.base_of(w, f) for w, f in HOOK_FORMS} == {"", "inference_mode", "1.0", "sync"}  # forms only
    inbwd = {layout for p in programs for tok, layout in _layouts(p) if tok == "fwd_bwd=inbwd"}
    assert {"fsdp", "tp", "fsdp_tp"} <= inbwd and not inbwd & {"ddp", *tp.AMP, *tp.FLOAT8}, inbwd


@pytest.mark.parametrize("program", [
    "ddp-ws2-w8-l1-sgd:fwd_bwd=inbwd",  # DDP's hook sees the local gradient before its all-reduce
    "fsdp_amp-ws2-w8-l1-sgd:fwd_bwd=inbwd",  # a scaler unscales every gradient before any step
    "fsdp_f8-ws2-w8-l1-sgd:fwd_bwd=inbwd",
    "fsdp-ws2-w8-l1-sgd:fwd_bwd,fwd_bwd=inbwd",  # a gradient held: the first hook would step it too
    "tp-ws2-w8-l1-sgd:fwd_bwd,eval=ema",  # no EMA yet
    "fsdp-ws2-w8-l1-sgd:fwd_bwd,step=ema,save,load=file,eval=ema",  # a restart drops it
])
def test_the_hook_rounds_calls_are_refused_where_no_loop_makes_them(program):
    with pytest.raises(tp.ProgramError, match="not where a loop makes it"):
        parse_program(program)


def test_the_hook_rounds_calls_parse_where_loops_make_them():
    parse_program("fsdp-ws2-w8-l1-sgd:fwd_bwd=inbwd,zero_grad,fwd_bwd=inbwd,step=ema,save,load,eval=ema")
    parse_program("tp-ws2-w8-l1-adamw:fwd_bwd,clip=total_norm,step=ema,fwd_bwd,clip=foreach,step,eval=ema")
    # the shrinker puts each form back to its value where the program stays one a loop makes
    shrunk = {p.text for p in smaller(parse_program("fsdp-ws2-w8-l1-sgd:fwd_bwd=inbwd,step=ema,fwd_bwd,clip=foreach,eval=ema"))}
    assert {"fsdp-ws2-w8-l1-sgd:fwd_bwd,step=ema,fwd_bwd,clip=foreach,eval=ema",
            "fsdp-ws2-w8-l1-sgd:fwd_bwd=inbwd,step=ema,fwd_bwd,clip,eval=ema"} <= shrunk
    assert "fsdp-ws2-w8-l1-sgd:fwd_bwd=inbwd,step,fwd_bwd,clip=foreach,eval=ema" not in shrunk  # no EMA to evaluate
    with pytest.raises(tp.ProgramError, match="not where a loop makes it"):  # inbwd left no gradient to clip
        parse_program("fsdp-ws2-w8-l1-sgd:fwd_bwd=inbwd,clip=foreach")


@pytest.mark.parametrize("program, signature, entry", [
    ("tp-ws2-w8-l1-adamw:fwd_bwd,clip=foreach",
     "RuntimeError: aten._foreach_norm.Scalar got mixed torch.Tensor and DTensor, need to convert all "
     "torch.Tensor to DTensor before calling distributed operators!", "torchtune2420-clip-mixed-dtensor"),
    ("tp-ws2-w8-l1-adamw:fwd_bwd,clip=total_norm",
     "RuntimeError: aten._foreach_norm.Scalar got mixed torch.Tensor and DTensor, need to convert all "
     "torch.Tensor to DTensor before calling distributed operators!", "torchtune2420-clip-mixed-dtensor"),
    ("fsdp_tp-ws4-w8-l1-adamw:fwd_bwd,clip=total_norm",
     "RuntimeError: All operands in aten.stack.default must have the same mesh, but got DeviceMesh((dp=2, tp=2), "
     "'cpu', stride=(2, N)) and DeviceMesh((dp=2), 'cpu', stride=(2,)).", "pytorch180346-clip-mixed-meshes"),
    ("tp-ws2-w8-l1-sgd:fwd_bwd,step=ema,step=ema",
     "RuntimeError: aten._foreach_lerp_.Scalar got mixed torch.Tensor and DTensor, need to convert all "
     "torch.Tensor to DTensor before calling distributed operators!", "dtensor-ema-foreach-lerp-mixed"),
    # AdamW's foreach step lerps too: that entry's, not the EMA's
    ("tp-ws2-w8-l1-adamw_foreach:fwd_bwd,step",
     "RuntimeError: aten._foreach_lerp_.Scalar got mixed torch.Tensor and DTensor", "torchtune2501-tp-fused-optimizer-mixed"),
    # FSDP2 (every parameter a DTensor on one mesh) clips over one list: not this entry's test
    ("fsdp-ws2-w8-l1-adamw:fwd_bwd,clip=foreach",
     "RuntimeError: aten._foreach_norm.Scalar got mixed torch.Tensor and DTensor", None),
])
def test_the_hook_rounds_finds_file_under_their_registered_bug(program, signature, entry):
    _files_under(program, signature, entry)


AC_ROUNDS = tuple(stream for stream, _, _ in pf.LATER_ROUNDS if stream != "later_ac")
"""Every round but the activation-checkpointing one (program_forms.LATER_FORMS_AC)."""


def test_the_checkpointing_round_never_moves_earlier_rounds_picks():
    """A program whose layout the round leaves alone is drawn as before it (eval=nogc is drawn on
    LAYOUT_hfac only); one it checkpoints keeps its head (sizes, optimizer, world size), the
    layout back to its value."""
    moved = 0
    for i in range(300):
        before, after = draw("ac-moves", i, rounds=AC_ROUNDS), draw("ac-moves", i)
        if after.layout not in tp.CHECKPOINTED:
            assert after.text == before.text, (i, after.text)
        else:
            moved += 1
            assert (tp.CHECKPOINTED[after.layout][0], after.world_size, after.width, after.layers, after.optim) == \
                (before.layout, before.world_size, before.width, before.layers, before.optim)
    assert moved


def test_the_checkpointing_round_is_drawn_where_its_calls_are_made():
    programs = [draw("reach-ac", i) for i in range(1500)]
    common = {"fsdp_tp_ac", "tp_ac", "ddp_ac", "ddp_hfac"}  # the fsdp forms: rare where 5 rounds took fsdp first
    assert common <= {p.layout for p in programs}
    assert all(tp.valid(p) for p in programs)
    only = [draw("ac", i, tuple(tp.CHECKPOINTED)) for i in range(80)]
    assert {p.layout for p in only} == set(tp.CHECKPOINTED)
    assert all(p.world_size == 4 for p in only if p.layout == "fsdp_tp_ac")
    cycled = [p for p in programs + only if "eval=nogc" in p.actions]
    assert cycled and all(tp.CHECKPOINTED[p.layout][1] == "hf" for p in cycled)


@pytest.mark.parametrize("layout", ["fsdp", "ddp", "fsdp_ac", "fsdp_cac", "ddp_ac", "tp_ac"])
def test_switching_checkpointing_off_for_generation_is_where_hugging_face_switched_it_on(layout):
    with pytest.raises(tp.ProgramError, match="not where a loop makes it"):
        parse_program(f"{layout}-ws2-w8-l1-sgd:fwd_bwd,eval=nogc")
    parse_program(f"{layout}-ws2-w8-l1-sgd:fwd_bwd,eval")
    hf = f"{layout.partition('_')[0]}_hfac"
    if hf in tp.LAYOUTS:
        parse_program(f"{hf}-ws2-w8-l1-sgd:fwd_bwd,eval=nogc")


def test_a_checkpointed_layout_shrinks_to_its_plain_one():
    program = parse_program("fsdp_tp_ac-ws4-w8-l1-sgd:fwd_bwd,fwd_bwd=nosync,fwd_bwd,reshard=true")
    shrunk = {e.apply(program).text for e in edits(program)}
    assert {"fsdp_tp-ws4-w8-l1-sgd:fwd_bwd,fwd_bwd=nosync,fwd_bwd,reshard=true",
            "fsdp_ac-ws2-w8-l1-sgd:fwd_bwd,fwd_bwd=nosync,fwd_bwd,reshard=true"} <= shrunk
    hf = parse_program("ddp_hfac-ws2-w8-l1-sgd:fwd_bwd,eval=nogc")
    assert "ddp_hfac-ws2-w8-l1-sgd:fwd_bwd,eval" in {e.apply(hf).text for e in edits(hf)}


@pytest.mark.parametrize("program, signature, entry", [
    ("fsdp_hfac-ws2-w8-l1-sgd:fwd_bwd=twice", "AssertionError: at action fwd_bwd=twice: blocks.N.norm.bias: gradient "
     "SQNR N dB < N dB (N problem(s))", "pytorch153354-fsdp2-reentrant-checkpoint-twice"),
    ("ddp_hfac-ws2-w8-l1-sgd:fwd_bwd=twice", "RuntimeError: Expected to mark a variable ready only once. This error is "
     "caused by one of the following reasons", "pytorch24005-ddp-reentrant-checkpoint-twice"),
    ("ddp_ac-ws2-w8-l1-sgd:compile,fwd_bwd", "AssertionError: at action fwd_bwd: blocks.N.norm.bias: gradient SQNR N dB "
     "< N dB (N problem(s))", "pytorch197039-compile-recomputes-mutated-buffer"),
    ("ddp_hfac-ws2-w8-l1-sgd:compile,fwd_bwd", "AssertionError: at action fwd_bwd: blocks.N.norm.bias: gradient SQNR N dB "
     "< N dB (N problem(s))", "pytorch197039-compile-recomputes-mutated-buffer"),
    ("tp_ac-ws2-w8-l1-adamw_fused:fwd_bwd,step", "RuntimeError: aten._fused_adamw_.default got mixed torch.Tensor and "
     "DTensor, need to convert all torch.Tensor to DTensor before calling distributed operators!",
     "torchtune2501-tp-fused-optimizer-mixed"),
    # the non-reentrant wrapper inside FSDP2 (torchtitan's) is the control: not this entry's program
    ("fsdp_ac-ws2-w8-l1-sgd:fwd_bwd=twice", "AssertionError: at action fwd_bwd=twice: blocks.N.norm.bias: gradient "
     "SQNR N dB < N dB (N problem(s))", None),
])
def test_the_checkpointing_finds_file_under_their_registered_bug(program, signature, entry):
    _files_under(program, signature, entry)
