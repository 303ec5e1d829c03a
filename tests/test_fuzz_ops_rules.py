"""The ops generator's RULES (distci/op_case.py `meaningless`) and the round-3 triage's filings.

A rule says what is meaningless, never what is broken upstream: an uneven `_StridedShard` on a
dim other than 0 is a layout FSDP2 refuses to build ("FSDP does not support uneven sharding on
dim N"), so the generator never draws it, never shrinks into it, and a case id carrying it runs
as `invalid`; the uneven strided shard FSDP2 does build (dim 0) stays drawn, and fails as the
known issue `dtensor-view-strided-shard-uneven`. The night's n8 and n10 file under their entries.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from distci.fuzz.ops import draw_cases
from distci.known_issues import load_registry
from distci.op_case import meaningless, parse_case
from distci.op_shrink import simpler, valid
from distci.stack import Stack

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("case_id,why", [
    # the night's n9 faces: a tp shard of 1 row over dp 2, on dims 1 and 3
    ("flatten01~2x2~f32~2x2x1~SS1.S1~-~0", "dim 1 (a tp shard of 1 over dp 2)"),
    ("reshape_merge~2x2~f32~1x1x2x2~SS3.S3~-~0", "dim 3 (a tp shard of 1 over dp 2)"),
    ("permute~2x2~bf16~3x7x5x12~SS2.S2~perm=3:2:1:0~499", "dim 2 (a tp shard of 3 over dp 2)"),
    # what FSDP2 builds: any size on dim 0, dims past 0 when dp divides every tp shard (or none is left)
    ("flatten01~2x2~f32~6x2x1~SS0.S0~-~0", None),
    ("flatten01~2x2~f32~3x2x1~SS0.S0~-~0", None),
    ("flatten01~2x2~f32~2x4x1~SS1.S1~-~0", None),
    ("flatten01~2x2~f32~2x0x1~SS1.S1~-~0", None),
    ("flatten01~2x2~f32~2x3x1~R.S1~-~0", None),
])
def test_an_uneven_strided_shard_past_dim_0_is_meaningless_and_says_why(case_id, why):
    got = meaningless(parse_case(case_id))
    if why is None:
        assert got is None
    else:
        assert why in got and "FSDP2 shards a dim other than 0 only evenly" in got


def test_the_generator_never_draws_nor_shrinks_into_a_meaningless_layout():
    cases = draw_cases("2026-12-07-night", 0, 4000)
    assert not [c.id for c in cases if meaningless(c)]
    strided = [c for c in cases if any(p[0].startswith("SS") for p in c.placements)]
    # the rule takes only the uneven ones past dim 0: dim 0 (uneven too) and even dims stay drawn
    assert any(p[0] == "SS0" for c in strided for p in c.placements)
    assert any(p[0].startswith("SS") and p[0] != "SS0" for c in strided for p in c.placements)
    even = parse_case("flatten01~2x2~f32~2x4x1~SS1.S1~-~0")
    assert valid(even) and all(valid(c) and not meaningless(c) for c in simpler(even))
    assert not valid(parse_case("flatten01~2x2~f32~2x2x1~SS1.S1~-~0"))


def test_a_case_id_the_rules_forbid_runs_as_invalid_not_as_a_find():
    pytest.importorskip("torch")
    from suites.generators.ops_cases import run_case

    out = run_case(parse_case("flatten01~2x2~f32~2x2x1~SS1.S1~-~0"), dist=None)
    assert out.status == "invalid" and "no parallelism builds it" in out.message


@pytest.mark.parametrize("test_id,signature,entry", [
    # n8 (ops night 2026-12-07): flatten of a dim sharded on both axes, its backward
    ("suites/generators/ops_entry.py::test_op_case[flatten01~2x2~f32~2x2x1~S1.S1~-~0]",
     "the backward raised RuntimeError: Cannot unflatten tensor with _StridedShard placement: split_factor=N "
     "does not match any output dimension.", "pytorch186282-dtensor-unflatten-two-axes-one-dim"),
    ("suites/generators/ops_entry.py::test_op_case[flatten01~2x2~f32~3x2x0~S1.S1~-~0]",
     "the backward raised RuntimeError: This operation would remove or reshape sharded dimension N, which "
     "requires redistribution. Please redistribute the input first.",
     "pytorch186282-dtensor-unflatten-two-axes-one-dim"),
    # n10: an embedding whose vocabulary shard is empty on one rank
    ("suites/generators/ops_entry.py::test_op_case[embedding~4~f32~1,5x0~R,S0~-~494]",
     "the op raised on some ranks only, the others hang: RuntimeError: index_select(): self indexing axis dim "
     "should be positive", "dtensor-embedding-empty-vocab-shard"),
    # the flatten of a dim sharded on one axis only is not that entry's
    ("suites/generators/ops_entry.py::test_op_case[flatten01~2x2~f32~2x2x1~R.S1~-~0]",
     "the backward raised RuntimeError: Cannot unflatten tensor with _StridedShard placement", None),
])
def test_the_nights_open_finds_file_under_their_entries(test_id, signature, entry):
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    for version in ("2.13.0", "2.15.0"):
        assert registry.match(test_id, signature, "", Stack(torch=version)) == entry
