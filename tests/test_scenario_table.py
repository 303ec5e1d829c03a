"""The scenario table's one column declaration: the record, validation, ids and README derive from it."""

from __future__ import annotations

import dataclasses

import pytest

from suites.scenario.table import COLUMNS, RULES, SCENARIOS, TABLE, Scenario, ScenarioError, row


def test_the_record_has_exactly_the_declared_columns_in_order():
    assert [f.name for f in dataclasses.fields(Scenario)] == [c.name for c in COLUMNS]
    for c in COLUMNS:
        assert c.doc and c.title, c.name
        if c.default is not None and c.axis and c.name != "parallel":
            assert c.default in c.values, f"{c.name}: default {c.default!r} is not an allowed value"


def test_as_dict_and_from_dict_round_trip_every_row():
    for s in TABLE:
        assert Scenario.from_dict(s.as_dict()) == s
        assert Scenario.from_dict(s.as_dict()).id == s.id


def test_ids_are_unique_and_defaults_leave_no_trace():
    assert len(SCENARIOS) == len(TABLE)
    assert row("tp").id == "tp-eager"
    assert row("tp_sp", "block", "aot_eager", ac="selective", world_size=4).id == "tp_sp-compile_block_aot_eager-ac_sel-ws4"


def test_an_unknown_column_names_the_closest_one():
    with pytest.raises(ScenarioError, match=r"unknown scenario column\(s\) 'acum' \(did you mean 'accum'\?\)"):
        row("fsdp", acum=2)


def test_a_value_outside_its_column_is_refused_with_the_allowed_ones():
    with pytest.raises(ScenarioError, match=r"scenario column ac='partial'; allowed: 'none', 'full', 'selective'"):
        row("tp", ac="partial")
    with pytest.raises(ScenarioError, match="async_tp=1"):
        row("tp_sp", "block", "inductor", async_tp=1)  # a bool column takes a bool, not a truthy int


@pytest.mark.parametrize("columns, message", [
    ({"parallel": "tp", "compile": "block"}, "a backend is named exactly when something is compiled"),
    ({"parallel": "tp", "mp": "bf16"}, "mixed precision is FSDP2's MixedPrecisionPolicy"),
    ({"parallel": "ep"}, "expert parallel needs the moe model"),
    ({"parallel": "fsdp", "loss_parallel": True}, "loss parallel shards the logits over a TP dim"),
    ({"parallel": "pp_fsdp", "schedule": "1f1b", "accum": 2}, "pp_fsdp and pp_tp are 2 x 2 meshes"),
    ({"parallel": "ep_fsdp", "model": "moe", "compile": "block", "backend": "eager", "world_size": 4},
     "ep_fsdp's dispatch sizes its all-to-all"),
    ({"parallel": "cp", "mp": "bf16"}, "mixed precision is FSDP2's MixedPrecisionPolicy"),
    ({"parallel": "cp", "model": "moe"}, "cp rows shard the dense model's sequence over 2 ranks"),
])
def test_every_rule_can_refuse_a_row(columns, message):
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict(columns)


def test_a_rule_never_forbids_what_fails_upstream():
    """clip_grad_norm_ over gradients on two meshes fails upstream: a row that fails as a known
    issue, not a combination the table and the fuzzer can never draw."""
    for clip in ("norm", "foreach"):
        assert row("ep_fsdp", model="moe", clip=clip, world_size=4).clip == clip


def test_every_rule_is_kept_by_every_row_and_has_a_message():
    for rule in RULES:
        assert rule.message
        assert not any(rule.broken(s) for s in TABLE)


def test_the_coverage_table_has_a_column_per_declared_column():
    from tools.coverage import render

    header = render(TABLE).splitlines()[4]
    assert header.count("|") == len(COLUMNS) + 1 + 3 + 1  # id, columns, three devices
    for c in COLUMNS:
        assert f" {c.title} " in header


def test_cp_rows_skip_on_cpu_with_the_measured_reason_and_run_on_cuda():
    from suites.scenario.devices import CP_NOT_ON_CPU, scenario_needs

    cp = [s for s in TABLE if s.parallel == "cp"]
    assert cp, "the table has context-parallel rows"
    for s in cp:
        assert ("skip", (), CP_NOT_ON_CPU) in scenario_needs(s, "cpu")
        assert not any(name == "skip" for name, _, _ in scenario_needs(s, "cuda")), s.id
    assert "_scaled_dot_product_flash_attention_for_cpu" in CP_NOT_ON_CPU


def test_multi_mesh_rows_never_enter_the_one_device_slice_as_themselves():
    """A cp / pp_* / ep_fsdp row needs >= 2 ranks: its projection is a plain one-device row."""
    from suites.judges.single_device import single_device_slice

    for s in single_device_slice():
        assert s.parallel == "single" and s.world_size == 1 and s.schedule == "none", s.id
        assert not s.id.startswith(("cp-", "pp_", "ep_fsdp-")), s.id


def test_two_dimensional_pp_and_torchtitan_ep_have_their_degrees():
    s = row("pp_fsdp", schedule="gpipe", accum=2, world_size=4)
    assert (s.pp_degree, s.tp_degree, s.dp_degree) == (2, 1, 2)
    s = row("pp_tp", schedule="gpipe", accum=2, world_size=4)
    assert (s.pp_degree, s.tp_degree, s.dp_degree, s.plan) == (2, 2, 1, "tp_sp")
    assert row("pp", schedule="gpipe", accum=2).dp_degree == 1
    assert row("ep_fsdp", model="moe", world_size=4).dp_degree == 4
    assert row("cp").dp_degree == 1
