"""Every generator's markdown report says, for each find, where the parallel run first left
the reference, so a find arrives triaged: the module and step for models (suites/localize.py),
the action for programs, the op and which of its outputs or input gradients for ops.

The messages are the cell side's entries' formats (suites/generators/models_entry.py,
programs_entry.py, ops_cases.py), as they print a real failure.
"""

from __future__ import annotations

from distci.fuzz.records import Outcome
from distci.stack import Stack

CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"
STACK = Stack.from_dict({"torch": "2.13.0", "python": "3.11"})

MODEL_MESSAGE = """the parameter gradient of tok.weight leaves the reference first (3 problem(s))
  fsdp-tied-steps2 on 2 cpu ranks
  first divergence: the parameter gradient of tok.weight (step 0; max |diff| 0.0123, 9.1e+04x the rounding bound)
  step 0: tok.weight: gradient SQNR 12.0 dB < 60 dB"""
PROGRAM_MESSAGE = """at action load: optimizer state exp_avg of blocks.0.w1.weight: SQNR N dB < N dB (2 problem(s))
  first divergence at action 4 (load) of fsdp-ws2-w8-l1-adamw:fwd_bwd,step,save,step,load on 2 cpu ranks
  optimizer state exp_avg of blocks.0.w1.weight: SQNR 3.1 dB < 99 dB"""


def test_the_models_report_names_the_first_diverging_module():
    from distci.fuzz.models import ModelFuzzer
    from distci.fuzz.models_cell import render

    def run(structures):
        return [Outcome(s, "failed", "AssertionError: the parameter gradient of tok.weight leaves the reference first",
                        1.0, message=MODEL_MESSAGE) if s["tie"] else Outcome(s, "passed", seconds=1.0)
                for s in structures]
    report = ModelFuzzer("where", run, 1e9, max_structures=12, log=lambda m: None).run()
    assert report.finds, "twelve draws held no tied structure"
    text = render(CELL, "where", 60, STACK, report, "today", "fuzz", "")
    assert "where:     first divergence: the parameter gradient of tok.weight (step 0;" in text


def test_a_model_find_without_a_diverging_tensor_says_so():
    from distci.fuzz.models import find_lines
    from distci.fuzz.records import Find

    o = Outcome({"parallel": "ddp"}, "failed", "AssertionError: x", message="x\n  (no traced tensor left its bound)",
                key="ddp")
    assert "  where:     no traced tensor left its rounding bound" in find_lines(CELL, Find(o, o))


def test_the_programs_report_names_the_first_diverging_action_and_is_written_by_the_command():
    from distci.fuzz.programs import ProgramFuzzer
    from distci.fuzz.programs_cell import render
    from distci.training_program import parse

    bug = parse("fsdp-ws2-w8-l1-adamw:fwd_bwd,step,save,step,load")

    def run(programs):
        return [Outcome(p, "failed", "AssertionError: at action load: optimizer state", 1.0, message=PROGRAM_MESSAGE)
                if p == bug else Outcome(p, "passed", seconds=1.0) for p in programs]
    fuzzer = ProgramFuzzer("where", run, budget_s=1e9, shrink=False, log=lambda m: None)
    fuzzer._found(run([bug])[0])
    text = render(CELL, "where", 60, STACK, fuzzer.report, "today", "fuzz", "")
    assert "where:  first divergence at action 4 (load) of fsdp-ws2-w8-l1-adamw" in text
    assert "Classification: new" in text and "## Every program" in text


def test_the_programs_command_takes_a_report_path():
    import inspect

    from distci.fuzz.programs_cell import fuzz_programs_cell, run_generator

    assert "report_path" in inspect.signature(fuzz_programs_cell).parameters
    assert "report_path=args.report" in inspect.getsource(run_generator)


def test_the_ops_report_names_the_op_and_which_gradient_left_the_full_op():
    from distci.fuzz.ops_command import OpsFind, OpsReport
    from distci.fuzz.ops_report import render_report

    case = "rms_norm~2~f32~4x6,6~S1,R~eps=1e-06~3"
    message = (f"rms_norm: gradient of input 0: value\n  gradient of input 0: value: differs by 0.5 of max(max|ref|, 1) "
               f"(4e+03x the float32 threshold 0.00012) first at (0, 5): 0.1 vs 0.6\n  case {case}")
    find = OpsFind("rms_norm: gradient of input 0: value", case, case, message, test_id=f"x::test_op_case[{case}]",
                   outcome="failed")
    text = render_report(OpsReport("where", finds=[find]), CELL, STACK, "today", "fuzz")
    assert "### 1. `rms_norm: gradient of input 0: value`" in text
    assert "gradient of input 0: value: differs by 0.5" in text
