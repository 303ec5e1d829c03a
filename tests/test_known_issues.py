"""The known-issues registry: a known failure is xfail, a new error never is."""

from pathlib import Path

import pytest

from distci.known_issues import RegistryError, load_registry, version_applies
from distci.results import error_signature
from distci.stack import Stack

REGISTRY = """
[[issue]]
id = "pytorch-184980"
title = "AOTAutograd cannot coerce a plain tangent to AsyncCollectiveTensor"
tests = ["suites/regressions/test_pytorch184980_*"]
signature = "guessed its metadata incorrectly|has no attribute '_local_tensor'"
upstream = "https://github.com/pytorch/pytorch/issues/184980"
fix = "act_tangent_coercion"
[issue.applies]
torch = ">=2.5,<2.15"
nightly_from = "2026-01-01"
nightly_until = "2026-12-31"
"""

TEST = "suites/regressions/test_pytorch184980_act_tangent_coercion.py::test_tp_compile"
SIG = "RuntimeError: During the backward, we encountered a tensor subclass where we guessed its metadata incorrectly."


@pytest.fixture
def registry(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text(REGISTRY)
    return load_registry(path)


def test_known_failure_matches(registry):
    assert registry.match(TEST, SIG, SIG, Stack.from_dict({"torch": "2.13.0+cpu"})) == "pytorch-184980"


def test_a_signature_broken_across_lines_still_matches(registry):
    """torch 2.11 breaks the message's line inside the signature text; the one matcher
    (Registry.known_issue_of, used by the recorder, the external runner and ingest)
    normalizes whitespace, so the known issue still matches. A pass where it applies is
    named too (verdict `fixed`); infra and skips never are."""
    wrapped = "RuntimeError: During the backward, we encountered a tensor subclass where we guessed its\n" \
              "    metadata incorrectly."
    first_line = wrapped.splitlines()[0]
    stack = Stack.from_dict({"torch": "2.11.0+cpu"})
    assert registry.match(TEST, first_line, wrapped, stack) == "pytorch-184980"
    assert registry.known_issue_of(TEST, "failed", signature=first_line, message=wrapped, stack=stack) \
        == "pytorch-184980"
    assert registry.known_issue_of(TEST, "failed", signature=first_line, message=wrapped, stack=stack,
                                   failure_kind="infra") is None
    assert registry.known_issue_of(TEST, "passed", signature=None, message="", stack=stack) == "pytorch-184980"
    assert registry.known_issue_of(TEST, "skipped", signature=None, message=wrapped, stack=stack) is None
    assert registry.known_issue_of(TEST, "failed", signature=None, message="guessed its\nshape", stack=stack) is None


def test_the_recorder_the_external_runner_and_ingest_share_the_matcher():
    """One matcher: nothing outside the registry calls match()/applicable() itself."""
    from pathlib import Path

    import distci

    root = Path(distci.__file__).parent
    callers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if p.name != "known_issues.py" and (".match(nodeid" in p.read_text() or ".applicable(" in p.read_text()
                                                         or "registry.match(" in p.read_text()))
    assert callers == []
    for module in ("harness/outcome.py", "judge/runreader.py"):  # Combined.to_result and index-time matching
        assert "known_issue_of(" in (root / module).read_text(), module
    for module in ("harness/recorder.py", "external/runner.py"):  # both build Results through Combined.to_result
        assert ".to_result(" in (root / module).read_text(), module


def test_a_new_error_in_the_same_test_is_not_hidden(registry):
    assert registry.match(TEST, "AssertionError: grads differ", "", Stack.from_dict({"torch": "2.13.0"})) is None


MULTI = """
[[issue]]
id = "rows"
tests = ["suites/test_scenarios.py::*asynctp*"]
signature = "gradient SQNR"
[[issue]]
id = "ag-unfused"
tests = ["suites/test_scenarios.py::*f8_rowwise*"]
signature = "fused all-gather matmuls"
"""
SCEN = "suites/test_scenarios.py::test_scenario[tp_sp-compile_block-f8_rowwise-asynctp]"


def _problems(*lines: str) -> str:
    return f"AssertionError: {SCEN}: {len(lines)} problem(s)\n  " + "\n  ".join(lines)


def test_every_listed_problem_must_be_explained(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text(MULTI)
    reg = load_registry(path)
    sqnr = "step 0: layers.0.wq.weight: gradient SQNR 8.1 dB < 15 dB"
    unfused = ("async TP did not fuse the all-gather side: 0 fused all-gather matmuls in the post-grad graphs "
               "(the reduce-scatter side fused 3)")
    assert reg.match(SCEN, "", _problems(sqnr, sqnr), Stack()) == "rows"
    assert reg.match(SCEN, "", _problems(sqnr, unfused), Stack()) == "rows,ag-unfused"
    # one problem no entry explains keeps the whole failure red
    assert reg.match(SCEN, "", _problems(sqnr, "step 1: loss 3.2 vs reference 2.9"), Stack()) is None
    # a list cut short cannot be checked
    assert reg.match(SCEN, "", _problems(sqnr) + "\n  ... and 40 more", Stack()) is None
    # both sides unfused: the all-gather entry does not explain the reduce-scatter line
    unfused_rs = ("async TP did not fuse the reduce-scatter side: 0 fused matmul reduce-scatters in the "
                  "post-grad graphs (the all-gather side fused 0)")
    assert reg.match(SCEN, "", _problems(unfused.replace("fused 3", "fused 0"), unfused_rs), Stack()) is None
    # an entry that does not cover the test id explains nothing there
    other = SCEN.replace("f8_rowwise", "f8_tensorwise")
    assert reg.match(other, "", _problems(sqnr, unfused), Stack()) is None


def test_outside_the_versions_it_does_not_apply(registry):
    assert registry.match(TEST, SIG, SIG, Stack.from_dict({"torch": "2.15.0"})) is None


def test_nightly_dates_place_dev_builds(registry):
    assert registry.match(TEST, SIG, SIG, Stack.from_dict({"torch": "2.15.0.dev20260301+cpu"})) == "pytorch-184980"
    assert registry.match(TEST, SIG, SIG, Stack.from_dict({"torch": "2.16.0.dev20270105+cpu"})) is None


def test_applied_fix_masks_the_entry(registry):
    stack = Stack.from_dict({"torch": "2.13.0", "fixes": [{"id": "act_tangent_coercion", "status": "applied"}]})
    assert registry.applicable(TEST, stack) == []
    assert [e.id for e in registry.applicable(TEST, Stack.from_dict({"torch": "2.13.0", "fixes": []}))] == ["pytorch-184980"]


def test_version_applies_rules():
    assert version_applies("2.7.0", ">=2.6,<2.8")
    assert not version_applies("2.8.0", ">=2.6,<2.8")
    assert version_applies("2.8.0a0+gitabc", ">=2.8")
    assert not version_applies("not-a-version", ">=2")


def test_bad_registry_names_the_entry_and_key(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text(REGISTRY.replace("upstream =", "upstrem ="))
    with pytest.raises(RegistryError, match=r"pytorch-184980.*upstrem"):
        load_registry(path)


CONSEQUENCES = """
[[issue]]
id = "unfreeze"
tests = ["suites/test_scenarios.py::*lora*"]
signature = "has a gradient the reference does not"
consequences = "^step [1-9][0-9]*: (loss .* vs reference|[^ ]+: gradient SQNR)"
"""
LORA = "suites/test_scenarios.py::test_scenario[tp-eager-lora]"


def test_consequences_are_explained_only_beside_their_root(tmp_path):
    """A frozen weight that trains (the root line) moves every later step's loss and
    gradients: those lines are the entry's consequences. Without the root in the same
    failure they stay unexplained, and a step-0 loss line is never a consequence."""
    path = tmp_path / "known_issues.toml"
    path.write_text(CONSEQUENCES)
    reg = load_registry(path)
    root = "step 0: layers.0.attention.wq.weight: has a gradient the reference does not"
    later_loss = "step 1: loss 5.575469 vs reference 5.567041 (|diff| 0.00843 > 1e-06 + 1e-05*|ref|)"
    later_sqnr = "step 1: layers.0.attention.wk.weight: gradient SQNR 22.0 dB < 60 dB"

    def problems(*lines: str) -> str:
        return f"AssertionError: tp-eager-lora: {len(lines)} problem(s)\n  " + "\n  ".join(lines)

    assert reg.match(LORA, "", problems(root, later_loss, later_sqnr), Stack()) == "unfreeze"
    assert reg.match(LORA, "", problems(later_loss, later_sqnr), Stack()) is None
    assert reg.match(LORA, "", problems(root, "step 0: loss 5.6 vs reference 5.5"), Stack()) is None


def test_a_bad_consequences_regex_names_the_entry(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text(CONSEQUENCES.replace('consequences = "^step', 'consequences = "(^step'))
    with pytest.raises(RegistryError, match="unfreeze.*consequences"):
        load_registry(path)


NOT_TESTS = """
[[issue]]
id = "act-into-block"
tests = ["suites/test_scenarios.py::test_scenario?tp*-compile_block-*"]
not_tests = ["*-frozen_embed*"]
signature = "has no attribute '_local_tensor'"
"""


def test_rows_the_bug_cannot_reach_are_neither_fixed_nor_known(tmp_path):
    """`not_tests` carves rows out of an entry's patterns: a pass there is a plain pass
    (not `fixed`, which would claim the bug gone), and a failure there, even with the
    entry's signature, stays a failure to look at."""
    path = tmp_path / "known_issues.toml"
    path.write_text(NOT_TESTS)
    reg = load_registry(path)
    reached = "suites/test_scenarios.py::test_scenario[tp_sp-compile_block-tied]"
    carved = "suites/test_scenarios.py::test_scenario[tp_sp-compile_block-frozen_embed]"
    err = "AttributeError: 'Tensor' object has no attribute '_local_tensor'"
    assert reg.known_issue_of(reached, "passed", signature=None, message="", stack=Stack()) == "act-into-block"
    assert reg.known_issue_of(carved, "passed", signature=None, message="", stack=Stack()) is None
    assert reg.known_issue_of(reached, "failed", signature=err, message=err, stack=Stack()) == "act-into-block"
    assert reg.known_issue_of(carved, "failed", signature=err, message=err, stack=Stack()) is None


def test_a_failure_outside_an_entrys_range_names_the_entry_it_missed(registry):
    """A range drawn too narrow (the entry measured on 2.13-2.15, the bug also on 2.12)
    leaves the failure unexplained, as it must; missed_by_stack names the entry and the condition
    that kept it out, so the person widening the range has the evidence in one line."""
    outside = Stack.from_dict({"torch": "2.16.0+cpu"})  # REGISTRY's entry: torch >=2.5,<2.15
    assert registry.match(TEST, SIG, SIG, outside) is None
    assert registry.missed_by_stack(TEST, SIG, SIG, outside) == [
        "pytorch-184980 (applies to torch >=2.5,<2.15 nightly_from 2026-01-01 nightly_until 2026-12-31; "
        "this stack has torch 2.16.0+cpu)"]
    masked = Stack.from_dict({"torch": "2.13.0+cpu", "fixes": [{"id": "act_tangent_coercion", "status": "applied"}]})
    assert registry.missed_by_stack(TEST, SIG, SIG, masked) == [
        "pytorch-184980 (its fix act_tangent_coercion is applied in this stack)"]
    assert registry.missed_by_stack(TEST, SIG, SIG, Stack.from_dict({"torch": "2.13.0+cpu"})) == []  # explained: no miss
    other = "RuntimeError: something else"
    assert registry.missed_by_stack(TEST, other, other, outside) == []  # another error: no entry's
    assert registry.missed_by_stack("suites/test_other.py::test_x", SIG, SIG, outside) == []  # another test


def test_the_2_11_op_faces_file_under_their_entries_and_the_fixed_ones_retire_on_2_13():
    """The ops generator's finds on torch 2.11.0 (seed 2026-12-09-t211, replayed by id): each files
    under its entry on 2.11.0; an entry whose repro passes on 2.13.0 no longer applies there, so a
    pass is not `fixed` noise and a failure there is new (reports/fuzz-2026-12-09-torch2.11.md)."""
    registry = load_registry(Path(__file__).resolve().parents[1] / "suites" / "known_issues.toml")
    faces = [  # (case, first line of its replay on 2.11.0, entry, does it still apply on 2.13.0)
        ("conv2d_patch~2~f32~1x2x2,1x1x2x2,1~R,R,R~stride=1~0", "the op raised RuntimeError: It requires that "
         "input_size[-1] is divisible by stride[-1] and stride[-1] equals kernel_size[-1] when there is padding for "
         "tensor parallel convolution.", "pytorch176446-tp-conv-unsharded-stride-checks", False),
        ("conv2d_patch~2~f32~1x2x2,1x1x2x2,1~R,R,R~stride=2~0", "conv2d_patch: gradient of input 1: value",
         "dtensor-conv2d-replicated-weight-grad", False),
        ("topk~2~f32~1x2~R~k=1,dim=-1~0", "the backward raised RuntimeError: aten.scatter.src got mixed torch.Tensor "
         "and DTensor, need to convert all torch.Tensor to DTensor", "pytorch178582-dtensor-topk-backward", False),
        ("stack~2~f32~1x1,1x1~R,S1~dim=-1~0", "stack: output 0: local shape", "dtensor-stack-sharded-last-dim", False),
        ("index_select~2~f32~2x1,2~R,S0~-~0", "the backward raised RuntimeError: index_add_(): Number of indices (2) "
         "should be equal to source.size(dim): (1), for dim: 0", "dtensor-index-select-sharded-index-backward", False),
        ("layer_norm~2~f32~1x2,2,2~R,R,S0~-~0", "the backward raised RuntimeError: Expected bias to be of same shape "
         "as normalized_shape, but got bias of shape [1] and normalized_shape = [2]",
         "dtensor-layer-norm-sharded-affine-backward", False),
        ("lp_nll_log_softmax~2x2~f32~1x2,1~S0.S-1,S0.R~reduction=sum~0", "the op raised ValueError: Currently "
         "loss_parallel() only supports input on one-dimensional DeviceMesh.", "pytorch180936-loss-parallel-2d-mesh",
         False),
        ("matmul~2x2~f32~1x1,1x2~SS0.S0,R.R~-~0", "the backward raised ValueError: use_strided_shard_as_shard_order "
         "is True, but placements: (_StridedShard(dim=0, sf=2), Shard(dim=0)) is unable to be interpreted into a "
         "corresponding shard_order", "dtensor-strided-shard-order-unreadable", False),
        ("dropout_train~2~f32~1x1~Psum~p=0.5~0", "the op raised RuntimeError: aten.bernoulli_.float with Partial is "
         "not supported yet!", "dtensor-dropout-partial", True),
        ("split~2~f32~2x2~R~size=1,dim=1,use=first~0", "the backward raised RuntimeError: aten.cat.default: got mixed "
         "torch.Tensor and DTensor, need to convert", "pytorch173123-dtensor-unread-output-grad", True),
        ("lp_logprobs~2~f32~1x1x2,1x1,1x1~S-1,R,R~how=selective~0", "the op raised RuntimeError: MaskBuffer has been "
         "materialized with conflicting data", "dtensor-gather-mask-partial-view", True),
    ]
    for case, line, entry, still in faces:
        test = f"suites/generators/ops_entry.py::test_op_case[{case}]"
        sig = error_signature("AssertionError", line)
        assert registry.match(test, sig, line, Stack(torch="2.11.0")) == entry, case
        assert (registry.match(test, sig, line, Stack(torch="2.13.0")) == entry) is still, case
