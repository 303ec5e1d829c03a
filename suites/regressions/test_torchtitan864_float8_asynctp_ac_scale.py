"""torchtitan#864: Float8 rowwise + async TP (+ full AC) fails to compile: the fused
scaled-matmul/reduce-scatter gets a 3-D A and a 2-D A_scale.

Upstream error with the fix off (torch 2.6; torch 2.7 for the reciprocal -> reshape
order only):
  ValueError: For row-wise scaling, the leading dims of A_scale must match the leading
  dims of A (A shape: torch.Size([2, 8, 16]), A_scale shape: torch.Size([16, 1]))
Fix: distci_fixes float8_asynctp_ac_scale.

test_pass_level proves the bug without a GPU, at the level where it lives: it builds
the post-grad graph Float8 rowwise produces for a TP row-wise linear (amax -> scale,
the float8 cast, reshape -> _scaled_mm -> reshape, reduce-scatter), in both orders in
which the scale's reciprocal and reshape occur, runs Inductor's micro-pipeline TP pass,
requires the fused op in the graph and propagates fake tensors through it, which calls
the fused op's meta function. The process group is a fake one (no communication) made
from public c10d APIs; the pass only needs its name and size.

test_e2e_float8_rowwise_asynctp_full_ac runs the real thing on 2 SM90 GPUs: the suites'
scenario `tp_sp-compile_block-ac_full-f8_rowwise-asynctp` (train vs. reference, and the
fused scaled-matmul/reduce-scatter ops required in the graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from ..conftest import tier_marks
from .conftest import fuse_with_micro_pipeline_tp

FIX_ID = "float8_asynctp_ac_scale"
B, S, K, N, WORLD = 2, 8, 16, 32, 2
E2E_SCENARIO = "tp_sp-compile_block-ac_full-f8_rowwise-asynctp"


@dataclass(frozen=True)
class Order:
    """How the graph turns the (B, S, 1) float8 scale into _scaled_mm's (B*S, 1) A_scale."""

    id: str
    reciprocal_first: bool


ORDERS = [
    Order("reshape_then_reciprocal", False),  # fixed upstream in 2.7
    Order("reciprocal_then_reshape", True),  # fixed upstream in 2.8
]


def tier(name: str):
    """The tier markers of a test first run in tier `name` (and in every later tier)."""

    def mark(fn):
        for m in tier_marks(name):
            fn = m(fn)
        return fn

    return mark


def _float8_rowwise_rs_graph(order: Order, group_name: str) -> torch.fx.GraphModule:
    aten, c10d = torch.ops.aten, torch.ops._c10d_functional
    g = torch.fx.Graph()
    a_hp, b_fp8, b_scale = g.placeholder("a_hp"), g.placeholder("b_fp8"), g.placeholder("b_scale")
    call = g.call_function
    amax = call(aten.amax.default, (call(aten.abs.default, (a_hp,)), [-1], True))
    amax = call(aten._to_copy.default, (amax,), {"dtype": torch.float32})
    scale = call(aten.div.Tensor, (448.0, call(aten.clamp.default, (amax, 1e-12))))  # (B, S, 1)
    a_fp8 = call(aten._to_copy.default, (call(aten.mul.Tensor, (a_hp, scale)),), {"dtype": torch.float8_e4m3fn})
    if order.reciprocal_first:
        a_scale = call(aten.reshape.default, (call(aten.reciprocal.default, (scale,)), [-1, 1]))
    else:
        a_scale = call(aten.reciprocal.default, (call(aten.reshape.default, (scale, [-1, 1])),))
    mm = call(aten._scaled_mm.default,
              (call(aten.reshape.default, (a_fp8, [-1, K])), b_fp8, a_scale, b_scale, None, None, torch.bfloat16))
    out = call(aten.reshape.default, (mm, [B, S, N]))
    reduced = call(c10d.wait_tensor.default, (call(c10d.reduce_scatter_tensor.default, (out, "sum", WORLD, group_name)),))
    g.output(reduced)
    return torch.fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: o.id)
@tier("pr")
def test_pass_level(fake_group, order: Order, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    pytest.importorskip("torch.distributed._symmetric_memory")
    if not hasattr(torch.ops.symm_mem, "fused_scaled_matmul_reduce_scatter"):
        pytest.skip("this torch has no fused scaled-matmul/reduce-scatter op")

    gm = _float8_rowwise_rs_graph(order, fake_group.group_name)
    mode, inputs, fused = fuse_with_micro_pipeline_tp(gm, lambda: (
        torch.randn(B, S, K, dtype=torch.bfloat16),
        torch.randn(N, K).to(torch.float8_e4m3fn).t(),
        torch.ones(1, N),
    ), monkeypatch)
    assert len(fused) == 1, f"the pass did not fuse the scaled matmul with the reduce-scatter:\n{gm.graph}"
    gm.recompile()
    result = FakeTensorProp(gm, mode).propagate(*inputs)
    assert tuple(result.shape) == (B // WORLD, S, N)
    assert result.dtype == torch.bfloat16


@tier("nightly")
@pytest.mark.world_size(2)
@pytest.mark.requires_accelerator("cuda")
@pytest.mark.requires_sm(90)
@pytest.mark.dist_timeout(300)
@pytest.mark.torchrun(nproc=2)
def test_e2e_float8_rowwise_asynctp_full_ac(dist) -> None:
    """Fresh processes (torchrun): symmetric memory is process-global, see test_scenarios."""
    pytest.importorskip("torchao")
    if dist.group is None:
        dist.init()
    from ..judges.checks import check_graph, check_numerics, expected_graph, require
    from ..scenario.devices import suite_device
    from ..scenario.table import MODEL, SCENARIOS
    from ..judges.tolerances import tolerance
    from ..runner.reference import run_reference
    from ..runner.training import run_parallel

    scenario = SCENARIOS[E2E_SCENARIO]
    dtype = suite_device(dist.device_type).dtype
    reference = run_reference(scenario, dist.device, dtype)
    run, evidence = run_parallel(scenario, dist.mesh(), dist.device, dtype)
    problems = check_numerics(reference, run, tolerance(dtype, scenario.float8))
    problems += check_graph(expected_graph(scenario, MODEL), evidence)
    for op in ("symm_mem::fused_scaled_matmul_reduce_scatter", "symm_mem::fused_all_gather_scaled_matmul"):
        if not evidence.post_grad_ops.get(op):
            problems.append(f"no {op} in inductor's post-grad graphs: Float8 async TP did not fuse")
    require(problems, f"{scenario.id} on {dist.world_size} {dist.device_type} ranks ({dtype})")
