"""The world-size-1 slice (suites/judges/single_device.py): derived from the table, judged for real.

The slice must follow the table by itself (a new row joins it, a row that needs a mesh
leaves it), and its checks must bite on one device: a one-device run trains in this
process (no process group), so a dropped gradient, a Float8 conversion that did not
happen and mixed precision that did not compute in bf16 are each shown to fail here.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")

from suites.judges import single_device as sd  # noqa: E402
from suites.scenario.table import SCENARIOS, TABLE, TIERS, Scenario, row  # noqa: E402
from suites.judges.tolerances import truth_tolerance  # noqa: E402


def test_every_slice_row_is_one_device_and_unique():
    rows = sd.single_device_slice()
    assert rows, "the slice is empty"
    assert len({r.id for r in rows}) == len(rows)
    for r in rows:
        assert (r.parallel, r.world_size, r.async_tp, r.resume, r.loss_parallel) == ("single", 1, False, "none", False), r.id
        assert TIERS.index(r.tier) >= TIERS.index(sd.FIRST_TIER), r.id


def test_every_table_row_is_represented_in_its_earliest_tier():
    from suites.scenario.table import ScenarioError

    rows = {r.id: r for r in sd.single_device_slice()}
    dropped = []
    for source in TABLE:
        one = sd.on_one_device(source)
        if one is None:  # only where the table's own rules reject the one-device form
            with pytest.raises(ScenarioError):
                dataclasses.replace(source, **sd.ONE_DEVICE)
            dropped.append(source.id)
            continue
        assert one.id in rows, f"{source.id} -> {one.id} is missing from the slice"
        assert TIERS.index(rows[one.id].tier) <= max(TIERS.index(source.tier), TIERS.index(sd.FIRST_TIER))
    assert len(dropped) < len(TABLE) // 10, dropped
    # Features that survive: Float8 recipes, AC modes, compile modes, mp.
    assert {r.float8 for r in rows.values()} == {s.float8 for s in TABLE}
    assert {r.ac for r in rows.values()} == {s.ac for s in TABLE}
    assert {(r.compile, r.backend) for r in rows.values()} == {(s.compile, s.backend) for s in TABLE}
    assert {r.mp for r in rows.values()} == {s.mp for s in TABLE}


def test_a_new_table_row_joins_the_slice_and_collapses_with_its_twins():
    new = row("tp_sp", "model", "inductor", ac="selective", float8="rowwise", async_tp=True, optim="adamw", accum=2)
    twin = dataclasses.replace(new, parallel="fsdp", async_tp=False, tier="release")
    rows = sd.single_device_slice([new, twin])
    assert [r.id for r in rows] == ["single-compile_model-ac_sel-f8_rowwise-ga2-ws1-adamw"]
    assert rows[0].tier == "nightly"


def test_a_column_that_needs_a_mesh_drops_the_row(monkeypatch):
    monkeypatch.setattr(sd, "ONE_DEVICE", {**sd.ONE_DEVICE, "world_size": 2})  # a projection the rules reject
    assert sd.on_one_device(SCENARIOS["tp-eager"]) is None


def test_reference_is_eager_float32_without_the_rows_features():
    row = next(r for r in sd.single_device_slice() if r.float8 == "rowwise" and r.ac != "none" and r.compiled)
    ref, dtype, tol = sd.reference_of(row, "bfloat16")
    assert (ref.compile, ref.backend, ref.ac, ref.float8, ref.mp, dtype) == ("none", "none", "none", "none", "none",
                                                                             "float32")
    assert tol == truth_tolerance("bfloat16", "rowwise")
    moe = next(r for r in sd.single_device_slice() if r.model == "moe" and r.compiled)
    ref, dtype, _ = sd.reference_of(moe, "bfloat16")
    assert dtype == "bfloat16" and not ref.compiled, "a bf16 router is judged by a bf16 router"
    ref, dtype, _ = sd.reference_of(moe, "float32")
    assert dtype == "float32"


def test_only_compiled_reduced_precision_moe_rows_are_judged_at_the_first_step():
    from suites.runner.evidence import TrainRecord

    rows = sd.single_device_slice()
    flagged = {r.id for r in rows if sd.routing_unobservable(r, "bfloat16")}
    assert flagged == {r.id for r in rows if r.model == "moe" and r.compiled}
    assert not any(sd.routing_unobservable(r, "float32") for r in rows if r.mp == "none")
    record = TrainRecord(losses=[1.0, 2.0, 3.0], grads=[{"w": None}, {"w": None}, {"w": None}])
    cut = sd.first_step_gradients(record)
    assert (cut.losses, len(cut.grads), len(record.grads)) == ([1.0, 2.0, 3.0], 1, 3)


def _row(sid: str) -> Scenario:
    return {r.id: r for r in sd.single_device_slice()}[sid]


def _judge(row: Scenario, mutation=None) -> list[str]:
    import torch

    from suites.judges.checks import check_graph, check_numerics, expected_graph
    from suites.runner.reference import run_reference
    from suites.runner.training import run_parallel

    ref_row, ref_dtype, tol = sd.reference_of(row, "float32")
    reference = run_reference(ref_row, torch.device("cpu"), ref_dtype)
    run, evidence = run_parallel(row, None, torch.device("cpu"), "float32", mutation)
    return check_numerics(reference, run, tol) + check_graph(expected_graph(row, "float32"), evidence)


@pytest.mark.slow
def test_one_device_control_passes_and_a_dropped_gradient_fails():
    from suites.runner.evidence import Mutation

    row = _row("single-eager-ac_full-ws1")
    assert _judge(row) == []

    def drop(model):  # the first block's w1 (under its AC wrapper) trains on a zero gradient
        w1 = next(p for n, p in model.named_parameters() if n.endswith("feed_forward.w1.weight"))
        w1.register_hook(lambda g: g * 0)

    problems = _judge(row, Mutation(after_parallelize=drop))
    assert any("w1.weight" in p and "SQNR" in p for p in problems), problems


def test_float8_that_did_not_happen_fails_on_one_device():
    import torch

    from suites.runner.evidence import Mutation

    from suites.probes import capabilities

    row = _row("single-eager-f8_tensorwise-ws1")
    missing = capabilities.torchao() or capabilities.scaled_mm("cpu", "tensorwise")
    if missing:
        pytest.skip(missing)
    problems = _judge(row, Mutation(float8_filter=lambda module, fqn: False))
    assert any("Float8 did not happen" in p for p in problems), problems


def test_mixed_precision_on_one_device_computes_in_bf16():
    """The autocast rows differ from float32 by bf16 rounding: within the bf16 tolerance,
    beyond the float32 one (so a run that silently stayed float32 would show ~inf dB)."""
    import torch

    from suites.judges.checks import check_numerics
    from suites.runner.reference import run_reference
    from suites.runner.training import run_parallel

    row = _row("single-eager-mp_bf16-ws1")
    ref_row, ref_dtype, tol = sd.reference_of(row, "float32")
    assert tol == truth_tolerance("bfloat16", "none")
    reference = run_reference(ref_row, torch.device("cpu"), ref_dtype)
    run, _ = run_parallel(row, None, torch.device("cpu"), "float32")
    assert check_numerics(reference, run, tol) == []
    assert check_numerics(reference, run, truth_tolerance("float32", "none")), "the run did not compute in bf16"
