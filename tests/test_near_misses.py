"""The near-miss rule has one owner (distci.known_issues.Registry.near_misses) and says no
more than it knows.

A registered entry whose signature has a generic alternative (`gradient SQNR`, `loss N vs
reference`) relies on its test patterns to say which bug it is. Read by signature alone,
outside those tests, it would claim every numeric difference any generator finds, so a new
bug would be reported as the old one and never filed. The rule: a find is an entry's near
miss only when a SPECIFIC alternative of the entry's signature (words beyond the judges'
generic ones) is in the find's error signature, and the entry applies to the stack.
Checked on the real registry's entries that have such alternatives, with the failure texts
their repros really print, through every generator's reading of a Result and its report.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from distci.known_issues import load_registry, names_a_bug
from distci.results import Result, error_signature
from distci.signatures import alternatives, required_words
from distci.stack import Stack

REPO = Path(__file__).resolve().parents[1]
REGISTRY = load_registry(REPO / "suites" / "known_issues.toml")
STACK = Stack(torch="2.13.0", cuda_available=True)
"""A stack every entry below applies to (the async-TP entry applies on CUDA only)."""
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"

CONFIG = "suites/fuzz_entry.py::test_fuzz_config[fsdp-eager-ga2-steps2-dim64]"
PROGRAM = "suites/generators/programs_entry.py::test_program[fsdp-ws2-w8-l1-sgd:fwd_bwd,zero_grad=zeros,fwd_bwd,step]"
STRUCTURE = "suites/generators/models_entry.py::test_model_structure[fsdp-tied-steps2]"
OP_CASE = "suites/generators/ops_entry.py::test_op_case[log_softmax~2~f32~8x5~S1~dim=-1~3]"

GENERIC = [
    # (a test of another door, the first line its judge writes about a numeric difference)
    (CONFIG, "AssertionError: step N: layers.N.attention.wq.weight: gradient SQNR N dB < N dB (N problem(s))"),
    (CONFIG, "AssertionError: step N: loss N vs reference N (|diff| N > N + N*|ref|) (N problem(s))"),
    (PROGRAM, "AssertionError: at action fwd_bwd: blocks.0.norm.bias: gradient SQNR N dB < N dB (N problem(s))"),
    (PROGRAM, "AssertionError: at action eval=inference_mode: loss N vs reference N (N problem(s))"),
    (PROGRAM, "AssertionError: at action fwd_bwd: head.weight: gradient max |diff| N > N * max|ref| (N) (N problem(s))"),
    (STRUCTURE, "AssertionError: the parameter gradient of tok.weight leaves the reference first (N problem(s))"),
    (OP_CASE, "AssertionError: log_softmax: gradient of input N: value"),
]

# What each entry's own repro prints when the bug is present (suites/regressions/, fixes off,
# torch 2.13.0 CPU, 2026-12-06; the async-TP one in its emulated mode): the repro's test id
# and its message's first line. OWN_ROWS below: the same for rows of their tests that are no
# repro (a table row, the programs the generator shrank them to).
REAL = {
    "pytorch190746-loss-parallel-log-softmax": (
        "suites/regressions/test_pytorch190746_loss_parallel_losses.py::test_loss_parallel_matches_the_plain_loss"
        "[soft_ce]",
        "soft_ce: the logits' gradient under loss_parallel() is off by 0.068 (max |grad| 0.0581)"),
    "pytorch197039-compile-recomputes-mutated-buffer": (
        "suites/regressions/test_pytorch197039_compile_recomputes_mutated_buffer.py::"
        "test_a_compiled_forward_that_bumps_a_buffer_has_eagers_gradient[aot_eager]",
        "compiled (aot_eager) gradient is 1.500x eager's: the backward read the buffer after the forward's "
        "in-place update"),
    "distci-ddp-freeze-after-wrap": (
        "suites/regressions/test_ddp_freeze_after_wrap.py::test_the_trainable_gradients_are_averaged_after_a_freeze"
        "[after_wrap]",
        "DDP (after_wrap): the trainable layer's gradient is this rank's own, never averaged over the ranks"),
    "pytorch131965-fsdp2-step-after-eval-stale-root": (
        "suites/regressions/test_pytorch131965_fsdp2_step_after_eval_stale_root.py::"
        "test_a_step_after_an_eval_forward_reaches_the_next_forward[plain]",
        "FSDP2: the forward after the optimizer step computed with the root's pre-step weights "
        "(max |diff| 10.4 against one process)"),
    "distci-asynctp-float8-sp-rows": (
        "suites/regressions/test_asynctp_float8_sp_rows.py::test_fused_scaled_mm_reduce_scatter_rows[emulated-b2-rowwise]",
        "fused_scaled_matmul_reduce_scatter(A (32, 32), orig_scatter_dim=1, scatter_dim_after_maybe_reshape=0, "
        "output_shape=[2, 16, 32]) on rank 0: SQNR 1.1 dB against the reduce-scatter along the sequence (< 25 dB) - "
        "it equals the batch-major row chunk (rows mixed up across sequence positions)"),
}
ENTRIES = list(REAL)
SOFT_CE_ROW = """tp-eager-soft_ce-loss_parallel on 2 cpu ranks (float32): 64 problem(s)
  step 1: loss 5.569398 vs reference 5.569703 (|diff| 0.000304 > 1e-06 + 1e-05*|ref|)
  step 0: layers.0.attention.wk.weight: gradient SQNR -11.5 dB < 60 dB
  step 0: layers.0.attention.wo.weight: gradient SQNR -15.6 dB < 60 dB"""
OWN_ROWS = [
    # (entry, a row of its own tests that is no repro, what that row printed: same stack)
    ("pytorch190746-loss-parallel-log-softmax", "suites/test_scenarios.py::test_scenario[tp-eager-soft_ce-loss_parallel]",
     SOFT_CE_ROW),
    ("distci-ddp-freeze-after-wrap",
     "suites/generators/programs_entry.py::test_program[ddp-ws2-w8-l1-sgd:freeze=head,fwd_bwd]",
     "at action fwd_bwd: blocks.0.norm.bias: gradient SQNR N dB < N dB (6 problem(s))"),
    ("pytorch131965-fsdp2-step-after-eval-stale-root",
     "suites/generators/programs_entry.py::test_program[fsdp-ws2-w8-l1-sgd:fwd_bwd,eval,step,fwd_bwd]",
     "at action fwd_bwd: blocks.0.norm.bias: gradient SQNR N dB < N dB (9 problem(s))"),
    ("pytorch197039-compile-recomputes-mutated-buffer",
     "suites/generators/programs_entry.py::test_program[ddp-ws2-w8-l1-sgd:compile,fwd_bwd]",
     "at action fwd_bwd: blocks.0.norm.bias: gradient SQNR N dB < N dB (8 problem(s))"),
]


def _signature(first_line: str) -> str:
    return error_signature("AssertionError", first_line)


@pytest.mark.parametrize("entry_id", ENTRIES)
def test_a_generic_numeric_failure_from_another_door_is_no_entrys_near_miss(entry_id):
    entry = next(e for e in REGISTRY.entries if e.id == entry_id)
    claimed = [(test, sig) for test, sig in GENERIC if entry.explains(sig)]
    assert claimed, f"{entry_id}: no generic line its signature explains (the case this rule is for)"
    for test, sig in GENERIC:
        assert REGISTRY.near_misses(test, sig, sig, STACK) == [], (test, sig)


@pytest.mark.parametrize("entry_id", ENTRIES)
def test_each_entrys_real_failure_text_still_matches_its_own_rows(entry_id):
    test, first = REAL[entry_id]
    sig = _signature(first)
    assert REGISTRY.match(test, sig, f"{first}\n  traceback ...", STACK) == entry_id


@pytest.mark.parametrize("entry_id, test, message", OWN_ROWS)
def test_an_entrys_generic_alternative_still_serves_its_own_table_and_program_rows(entry_id, test, message):
    """The rule narrows near misses only: an entry's own rows, which print the judges' generic
    lines, stay its known issue (the generic alternative serves its test patterns)."""
    assert REGISTRY.match(test, _signature(message), message, STACK) == entry_id
    other = PROGRAM if test != PROGRAM else CONFIG
    assert REGISTRY.near_misses(other, _signature(message), message, STACK) == []


@pytest.mark.parametrize("entry_id", ENTRIES)
def test_the_real_failure_text_through_another_door_is_the_entrys_near_miss(entry_id):
    sig = _signature(REAL[entry_id][1])
    for test in (CONFIG, PROGRAM, STRUCTURE, OP_CASE):
        assert REGISTRY.near_misses(test, sig, sig, STACK) == [entry_id], test
    assert REGISTRY.near_misses(PROGRAM, sig, sig, Stack(torch="2.4.0")) == []  # where it does not apply


def test_an_entrys_own_test_is_never_its_near_miss():
    test, first = REAL["distci-ddp-freeze-after-wrap"]
    sig = _signature(first)
    assert REGISTRY.near_misses(test, sig, sig, STACK) == []  # explained: a known issue, not a near miss


def test_the_specific_part_is_what_the_signature_itself_says():
    assert alternatives(r"a|(b|c)|max [|]diff[|]|\|x") == ["a", "(b|c)", "max [|]diff[|]", r"\|x"]
    # a word beside a wildcard may be a fragment; a parameter name a class matched is no word of it
    assert required_words(r"step [1-9][0-9]*: [a-z0-9_.]+: gradient (SQNR|max)") == ["step", "gradient"]
    assert required_words(r"^eval: (loss|logits)") == []  # the parser factors out `lo`: a fragment
    assert required_words(r"gradient under loss_parallel\(\) is off") == ["gradient", "under", "loss_parallel",
                                                                           "is", "off"]
    assert not names_a_bug(["step", "loss", "vs", "reference", "N", "1e"])
    assert names_a_bug(["never", "averaged"])


def test_every_entry_says_which_of_its_alternatives_name_a_bug():
    by_id = {e.id: e for e in REGISTRY.entries}
    # the reducer's own words for the entry's later error name it; the loss-scaling judge's
    # `is finite where the reference's overflowed` is a judge phrase (any overflow disagreement)
    assert [a.pattern for a in by_id["distci-ddp-freeze-after-wrap"].specific] == [
        "never averaged over the ranks", "Expected to have finished reduction in the prior iteration"]
    assert [a.pattern for a in by_id["pytorch190746-loss-parallel-log-softmax"].specific] == [
        r"gradient under loss_parallel\(\) is off"]


# --- every generator's report names a near miss, read through the one rule -------------------------------


def _result(test_id: str, first_line: str) -> Result:
    sig = _signature(first_line)
    known = REGISTRY.known_issue_of(test_id, "failed", signature=sig, message=first_line, stack=STACK)
    return Result("run-1", CELL, test_id, "failed", STACK, "assert", sig, first_line, 1.0, known_issue=known)


SPECIFIC = REAL["distci-ddp-freeze-after-wrap"][1]
GENERIC_LINE = "step N: loss N vs reference N (relative error N > N)"


def test_the_configurations_report_names_the_near_miss_and_a_generic_failure_stays_new():
    from distci.fuzz import space as fuzz_space
    from distci.fuzz.engine import Fuzzer
    from distci.fuzz.records import outcome_of
    from distci.fuzz.report import FuzzRun, render_report
    from suites.generators import space as cell

    space = fuzz_space.Space(cell)
    for line, near in ((SPECIFIC, True), (GENERIC_LINE, False)):
        def run(points):
            return [outcome_of(p, space.key(p), _result(f"{cell.ENTRY_TEST}::test_fuzz_config[{space.key(p)}]", line),
                               REGISTRY) for p in points]
        report = Fuzzer(space, "near", run, max_configs=2, batch_size=2, log=lambda m: None).run()
        text = render_report(FuzzRun(CELL, "near", 60, space, "run-1", STACK), report, "today", "fuzz")
        assert ("near miss of registered distci-ddp-freeze-after-wrap" in text) is near
        assert bool(report.new) is not near


def test_the_programs_report_names_the_near_miss_and_a_generic_failure_stays_new():
    from distci.fuzz.programs import ProgramFuzzer
    from distci.fuzz.programs_cell import find_lines, report_json, test_id
    from distci.fuzz.records import outcome_of

    for line, near in ((SPECIFIC, True), (GENERIC_LINE, False)):
        def run(programs):
            return [outcome_of(p, p.text, _result(test_id(p), line), REGISTRY) for p in programs]
        report = ProgramFuzzer("near", run, budget_s=100, max_programs=2, batch_size=2, log=lambda m: None).run()
        lines = "\n".join(line for f in report.finds for line in find_lines(CELL, f))
        assert ("near miss of distci-ddp-freeze-after-wrap" in lines) is near
        saved = report_json(CELL, "near", 100, STACK, report, 1.0)
        assert all((f["near_miss"] == "distci-ddp-freeze-after-wrap") is near for f in saved["finds"])
        assert bool(report.new) is not near


def test_a_replayed_near_miss_is_counted_as_one_and_a_generic_failure_as_new():
    """`--replay` files its failure as a run's draw is filed: the summary's counts, the exit code
    and report.json's finds agree (a replayed near miss used to count as 0 near misses, 0 finds)."""
    from distci.fuzz.programs_cell import report_json, test_id
    from distci.fuzz.records import Report, outcome_of
    from distci.training_program import parse

    program = parse("tp-ws2-w8-l1-adamw:fwd_bwd,save,step")
    for line, near in ((SPECIFIC, True), (GENERIC_LINE, False)):
        said = []
        report = Report.of_replay([outcome_of(program, program.text, _result(test_id(program), line), REGISTRY)],
                                  said.append)
        assert len(report.finds) == 1 and len(report.near_misses) == int(near) and len(report.new) == int(not near)
        saved = report_json(CELL, "replay", 0, STACK, report, 1.0)
        assert [f["near_miss"] for f in saved["finds"]] == (["distci-ddp-freeze-after-wrap"] if near else [None])
        assert any("near miss of distci-ddp-freeze-after-wrap" in m for m in said) is near


def test_the_models_report_names_the_near_miss_and_a_generic_failure_stays_new():
    from distci.fuzz.models import ENTRY_TEST, TEST_NAME, ModelFuzzer
    from distci.fuzz.models_cell import render
    from distci.fuzz.records import outcome_of
    from suites.generators.model_space import key

    for line, near in ((SPECIFIC, True), (GENERIC_LINE, False)):
        def run(structures):
            return [outcome_of(s, key(s), _result(f"{ENTRY_TEST}::{TEST_NAME}[{key(s)}]", line), REGISTRY)
                    for s in structures]
        report = ModelFuzzer("near", run, 1e9, max_structures=2, batch_size=2, log=lambda m: None).run()
        text = render(CELL, "near", 60, STACK, report, "today", "fuzz", "")
        assert ("Classification: near miss of registered distci-ddp-freeze-after-wrap" in text) is near
        assert bool(report.new) is not near


def test_the_ops_report_names_the_near_miss_and_a_generic_failure_stays_new():
    from distci.fuzz.ops_command import OpsFind, OpsReport, judge_find
    from distci.fuzz.ops_report import render_report

    for line, near in ((SPECIFIC, True), (GENERIC_LINE, False)):
        find = OpsFind(line, "a", "b", line)
        judge_find(find, OP_CASE, _result(OP_CASE, line), REGISTRY)
        text = render_report(OpsReport("near", finds=[find]), CELL, STACK, "today", "fuzz")
        assert ("near miss of `distci-ddp-freeze-after-wrap`" in text) is near
        assert find.new is not near


def test_the_nightly_files_a_generic_fuzz_failure_and_not_a_near_miss():
    """The nightly's filing (distci.ci.regressions) asks the same rule."""
    generic, specific = _result(CONFIG, GENERIC_LINE), _result(CONFIG, SPECIFIC)
    assert REGISTRY.near_misses(CONFIG, generic.error_signature, generic.message, STACK) == []
    assert REGISTRY.near_misses(CONFIG, specific.error_signature, specific.message, STACK) == [
        "distci-ddp-freeze-after-wrap"]


def test_a_dead_sweep_of_another_op_is_no_near_miss_of_the_max_entry():
    """The night runs' argmax sweep died and was named `dtensor-max-empty-shard`'s near miss
    only because that entry's signature also says "the sweep died on this case", words the ops
    generator writes for every op's crash, hang or timeout."""
    dead = "suites/generators/ops_entry.py::test_op_case[argmax~2~f32~1x2~S-1~dim=-1~671]"
    sig = "argmax: the sweep died on this case"
    assert REGISTRY.near_misses(dead, sig, sig, STACK) == []
    real = "amax with empty shards raised on ranks [1] only"
    assert REGISTRY.near_misses(dead, real, real, STACK) == ["dtensor-max-empty-shard"]


def test_argmax_empty_shard_faces_file_under_their_own_entry_and_a_dead_sweep_under_none():
    """argmax's empty-shard face (the ops generator on torch 2.11.0, seed 2026-12-09-t211; the
    repro fails alike on 2.11.0, 2.13.0 and 2.15.0) is dtensor-argmax-empty-shard's, read by the
    raise itself: the max entry keeps its "the sweep died" words and still takes no dead argmax
    sweep (test_a_dead_sweep_of_another_op_is_no_near_miss_of_the_max_entry)."""
    faces = {
        "argmax~4~f32~8x9x0~S-2~dim=1~536": "the op raised on some ranks only, the others hang: IndexError: max(): "
                                            "Expected reduction dim N to have non-zero size.",
        "argmax~2~f32~13x1~S-1~dim=-1~357": "the op with empty shards raised on ranks holding them only, the others "
                                            "hang: IndexError: max(): Expected reduction dim N to have non-zero size.",
    }
    for torch in ("2.11.0", "2.13.0", "2.15.0"):
        for case, line in faces.items():
            test = f"suites/generators/ops_entry.py::test_op_case[{case}]"
            sig = error_signature("AssertionError", line)
            assert REGISTRY.match(test, sig, line, Stack(torch=torch)) == "dtensor-argmax-empty-shard"
        dead = "suites/generators/ops_entry.py::test_op_case[argmax~2~f32~1x2~S-1~dim=-1~671]"
        sig = "argmax: the sweep died on this case"
        assert REGISTRY.match(dead, sig, sig, Stack(torch=torch)) is None
        assert REGISTRY.near_misses(dead, sig, sig, Stack(torch=torch)) == []
