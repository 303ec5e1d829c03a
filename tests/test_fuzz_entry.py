"""What the fuzz entry judges: a drawn point whose own data does not exercise a MoE row's
design is not judged (skipped), a real problem beside it still fails; and the Float8
expectation counts what the conversion swaps in every model the space can draw."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchao.float8")

from suites.judges.checks import expected_graph  # noqa: E402 - after the torch check
from suites.fuzz_entry import judged  # noqa: E402
from suites.runner.models import build_model  # noqa: E402
from suites.runner.parallelize import convert_float8  # noqa: E402
from suites.generators.space import scenario  # noqa: E402

STARVED = "routing: experts [3] never got a token: their gradients are not tested"
NO_EMPTY = "routing: every expert got tokens in every microbatch (min 1): the empty-expert path was not exercised"
GRAD = "step 1: layers.0.feed_forward.w1.weight: gradient SQNR 3 dB < 20 dB"


def test_a_points_own_routing_is_not_judged_but_a_real_problem_is():
    assert judged([STARVED, NO_EMPTY]) == ([], [STARVED, NO_EMPTY])
    assert judged([NO_EMPTY, GRAD]) == ([GRAD], [NO_EMPTY])
    assert judged([GRAD]) == ([GRAD], [])


@pytest.mark.parametrize("point", [
    {"parallel": "tp", "float8": "tensorwise"},
    {"parallel": "tp", "model": "moe", "float8": "tensorwise"},
    {"parallel": "tp", "model": "moe", "float8": "rowwise", "layers": 1, "dim": 64},
    {"parallel": "tp", "float8": "rowwise", "layers": 3},
])
def test_the_float8_expectation_counts_what_the_conversion_swaps(point):
    s = scenario(point)
    model = build_model(s.model_args, 0)
    assert expected_graph(s).float8_linears == convert_float8(model, s.float8), s.id
