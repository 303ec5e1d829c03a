"""The programs generator reaches the real upstream bugs of reports/fuzz-reach-2026-12-06.md's
"round 2, evening": each widening (a form of a drawn value, distci/training_program.py FORMS,
grounded in torchtitan's checkpoint and optimizer code and its default FSDP2 policy) is proven
here: the generator draws it (quick, no ranks), its finds file under their registered entries
on the stacks the entries name (quick), and a bounded seeded run on 2 gloo ranks finds them and
files them as known issues, never as new (slow; where the registry says an entry does not apply
to this stack, the same run must not fail that way: both halves can fail).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import distci.training_program as tp
from distci.fuzz.programs import draw, edits
from distci.known_issues import load_registry
from distci.stack import Stack
from distci.training_program import parse, split

REPO = Path(__file__).resolve().parents[1]
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"
FROZEN = "pytorch192202-dsd-optim-state-frozen-params"
FLAT = "pytorch192225-dsd-flat-stateless-empty-state"
FLAT_TYPEERROR = "pytorch192224-dsd-flat-missing-state-typeerror"
MP = "pytorch186998-fsdp2-mp-unfreeze-after-frozen-forward"


def _base(text: str) -> str:
    """A program's text with every form back to the value it is a form of."""
    program = parse(text)
    base = {form: value for (what, value), forms in tp.FORMS.items() for form in forms}
    actions = tuple(a if split(a)[1] not in base or split(a)[0] != "save" else "save" for a in program.actions)
    return tp.Program(base.get(program.layout, program.layout), program.world_size, program.width,
                      program.layers, base.get(program.optim, program.optim), actions).text


def test_the_generator_draws_torchtitans_flattened_checkpoints_bf16_fsdp_and_stateless_sgd():
    programs = [draw("reach", i) for i in range(1500)]
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


def test_a_restricted_layout_draws_only_what_it_names():
    assert {draw("only", i, ("fsdp",)).layout for i in range(50)} == {"fsdp"}
    assert {draw("only", i, ("fsdp_mp",)).layout for i in range(50)} == {"fsdp_mp"}


def test_a_form_shrinks_to_its_plain_value():
    program = parse("fsdp_mp-ws4-w8-l1-sgd0:fwd_bwd,step,save=flat,load")
    shrunk = {e.apply(program).text for e in edits(program)}
    assert "fsdp-ws2-w8-l1-sgd0:fwd_bwd,step,save=flat,load" in shrunk
    assert "fsdp_mp-ws4-w8-l1-sgd:fwd_bwd,step,save=flat,load" in shrunk
    assert "fsdp_mp-ws4-w8-l1-sgd0:fwd_bwd,step,save,load" in shrunk


@pytest.mark.parametrize("program, signature, torch_version, entry", [
    ("fsdp-ws2-w8-l1-adamw:fwd_bwd,step,freeze=head,save,load",
     "AssertionError: at action load: optimizer state: entries missing from the run (exp_avg, exp_avg_sq, step; "
     "first exp_avg of head.bias) (N problem(s))", "2.13.0", FROZEN),
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


# --- bounded runs ------------------------------------------------------------------------------

# seed -> (layouts, the entry its first programs meet, the drawn program that meets it): chosen with
# the seeded draw alone (`python -m distci fuzz --generator programs --list --seed S --layout L`)
BOUNDED = {
    "reach13716": ("fsdp", FROZEN, "fsdp-ws2-w16-l1-adamw:fwd_bwd,sched,fwd_bwd,step,zero_grad,zero_grad,zero_grad,"
                                   "freeze=head,zero_grad=zeros,save=flat,step,zero_grad=zeros,load"),
    "reach1145": ("fsdp", FLAT, "fsdp-ws4-w32-l1-sgd0:metric,sched,sched,fwd_bwd,sched,step,save=flat,load,"
                                "fwd_bwd=nosync,fwd_bwd"),
    "reach1021": ("fsdp_mp", MP, "fsdp_mp-ws2-w16-l3-sgd:freeze,fwd_bwd,new_optim,step,fwd_bwd,new_optim,sched,step,"
                                 "zero_grad,unfreeze,fwd_bwd,save"),
}


def _fuzz(tmp: Path, *args: str) -> tuple[str, list[dict]]:
    from distci.harness import procs

    cmd = [sys.executable, "-m", "distci", "fuzz", "--generator", "programs", "--cell", CELL,
           "--python", sys.executable, "--runs-root", str(tmp / "runs"), *args]
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

    spec = next(i for i in load_registry(REPO / "suites" / "known_issues.toml").entries if i.id == entry)
    return spec.applies_to(Stack(torch=torch.__version__.split("+")[0]))


@pytest.mark.slow
@pytest.mark.parametrize("seed", list(BOUNDED))
def test_a_bounded_programs_run_finds_the_bug_and_files_it_known(tmp_path, seed):
    pytest.importorskip("torch")
    layouts, entry, program = BOUNDED[seed]
    assert program in [draw(seed, i, (layouts,)).text for i in range(4)]
    out, results = _fuzz(tmp_path, "--seed", seed, "--layout", layouts, "--max-programs", "4", "--batch", "4",
                         "--no-shrink", "--budget", "10m")
    mine = [r for r in results if r["test_id"].endswith(f"[{program}]")]
    assert mine, out[-3000:]
    if _applies(entry):
        assert mine[0]["outcome"] == "failed" and mine[0]["known_issue"] == entry, (mine[0], out[-3000:])
    else:
        assert mine[0]["known_issue"] != entry, mine[0]
