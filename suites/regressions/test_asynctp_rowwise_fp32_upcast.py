"""Async TP + Float8 rowwise in a float32 model: no matmul/reduce-scatter is fused (silent).

Found by distci on 2×H200 (torch 2.11, torchao 0.17, torchtitan 0.2.2): torchtitan's
llama3 with TP + sequence parallel + Float8 rowwise + async TP trains with the right
numbers, but its post-grad graphs hold 0 fused matmul reduce-scatters (and 0 fused
all-gather matmuls: pytorch#149990). The same scenario in bfloat16 fuses every
reduce-scatter. torchtitan trains TP-only jobs in float32 (mixed precision comes with
FSDP), so such a job gets async TP's overhead and none of its overlap, and nothing says so
(torchtitan#866 reported the missing speed-up, not this cause).

Cause: cuBLAS's row-wise `_scaled_mm` has only a bfloat16 output, so torchao computes a
float32 (or float16) linear as `_scaled_mm(..., out_dtype=bfloat16).to(float32)`.
Inductor's micro-pipeline TP pass looks for the reduce-scatter's producer as
`_scaled_mm` or `reshape -> _scaled_mm -> reshape` (`_find_producer_matmul`) and does not
look through the conversion, so it fuses nothing.

test_pass_level shows both halves on CPU, on every torch with the fused op:
1. it traces torchao's own rowwise Float8 linear (fake tensors, no kernel runs) to learn
   what follows `_scaled_mm` in the model's dtype;
2. it builds the post-grad graph a row-parallel linear makes from that (reshape ->
   _scaled_mm -> [the conversion torchao emits] -> reshape -> reduce-scatter), runs
   inductor's pass and requires the fused op. bfloat16 is the control and must fuse.
When torchao stops upcasting or the pass learns to look through the conversion, the
float32 case passes and the known issue reports itself `fixed`.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks
from .conftest import fuse_with_micro_pipeline_tp

B, S, K, N = 2, 8, 32, 64
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}

pytestmark = tier_marks("pr")


def _what_torchao_emits(dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype | None]:
    """(out_dtype of torchao's rowwise `_scaled_mm`, the dtype it converts that output to or None)."""
    pytest.importorskip("torchao")
    from torch.fx.experimental.proxy_tensor import make_fx
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model = torch.nn.Sequential(torch.nn.Linear(K, N, bias=False)).to(dtype)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("rowwise"))
    weight = model[0].weight.detach()

    def forward(x, w):
        return torch.func.functional_call(model, {"0.weight": w}, (x,))

    gm = make_fx(forward, tracing_mode="fake")(torch.randn(B, S, K, dtype=dtype), weight)
    mms = [n for n in gm.graph.nodes if n.target is torch.ops.aten._scaled_mm.default]
    assert len(mms) == 1, f"expected one _scaled_mm in torchao's rowwise linear:\n{gm.graph}"
    out_dtype = mms[0].meta["val"].dtype
    converted = None
    for user in mms[0].users:
        val = user.meta.get("val")
        if user.target in (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default) \
                and isinstance(val, torch.Tensor) and val.dtype != out_dtype:
            converted = val.dtype
    return out_dtype, converted


def _row_parallel_rs_graph(out_dtype: torch.dtype, converted: torch.dtype | None, group_name: str,
                           world: int) -> torch.fx.GraphModule:
    """The post-grad graph of a row-parallel Float8 rowwise linear followed by its reduce-scatter."""
    aten, c10d = torch.ops.aten, torch.ops._c10d_functional
    g = torch.fx.Graph()
    a_fp8, a_scale = g.placeholder("a_fp8"), g.placeholder("a_scale")
    b_fp8, b_scale = g.placeholder("b_fp8"), g.placeholder("b_scale")
    call = g.call_function
    mm = call(aten._scaled_mm.default,
              (call(aten.reshape.default, (a_fp8, [-1, K])), b_fp8, a_scale, b_scale, None, None, out_dtype))
    if converted is not None:
        mm = call(torch.ops.prims.convert_element_type.default, (mm, converted))
    out = call(aten.reshape.default, (mm, [B, S, N]))
    reduced = call(c10d.wait_tensor.default, (call(c10d.reduce_scatter_tensor.default, (out, "sum", world, group_name)),))
    g.output(reduced)
    return torch.fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_pass_level(fake_group, dtype_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch.distributed._symmetric_memory")
    if not hasattr(torch.ops.symm_mem, "fused_scaled_matmul_reduce_scatter"):
        pytest.skip("this torch has no fused scaled-matmul/reduce-scatter op")

    out_dtype, converted = _what_torchao_emits(DTYPES[dtype_name])
    gm = _row_parallel_rs_graph(out_dtype, converted, fake_group.group_name, fake_group.size())
    _, _, fused = fuse_with_micro_pipeline_tp(gm, lambda: (
        torch.randn(B, S, K).to(torch.float8_e4m3fn),
        torch.ones(B * S, 1),
        torch.randn(N, K).to(torch.float8_e4m3fn).t(),
        torch.ones(1, N),
    ), monkeypatch)
    if not fused:
        what = (f"torchao's conversion of the {out_dtype} _scaled_mm output to {converted} sits between the matmul "
                "and the reduce-scatter" if converted else "no conversion in between")
        raise AssertionError(f"{dtype_name}: the pass did not fuse the scaled matmul with the reduce-scatter "
                             f"({what}):\n{gm.graph}")
