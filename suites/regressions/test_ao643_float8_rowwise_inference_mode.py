"""torchao Float8 training linears under torch.inference_mode() raise (ao#643: rowwise and TP faces).

Trigger: a model converted with `convert_to_float8_training` under a rowwise recipe
(`rowwise`, `rowwise_with_gw_hp`), a 3-D input (batch, seq, dim) and an eval forward
under `torch.inference_mode()`: `aten.linear` is CompositeImplicitAutograd, inference mode
skips the Autograd key that decomposes it, so the Float8 training tensor receives
`aten.reshape` and its axiswise (rowwise) scaling asserts "aten.reshape.default with
axiswise scaling is not supported yet". ao#643 (closed by ao#659, which added `reshape`)
was the tensorwise face; tensorwise passes here (the control), as does `no_grad()`.
Found by the scenario fuzzer (seed 2026-12-02, torch 2.13.0 and 2.15.0, torchao 0.18.0) as
`*-f8_rowwise*-eval_inference`; the table had no Float8 x eval row. One process.
The tensorwise face under TP (2 ranks, the second test): torchao's Float8 TP styles hand
the Float8 input to DTensor.from_local, whose `view_as` reaches the Float8 tensor under
inference_mode ("attempting to run aten.view_as.default, this is not supported"); seen
while shrinking as `tp-eager-f8_tensorwise-varlen-eval_inference-ws4`, reduced to
`tp-eager-f8_tensorwise-eval_inference`. `no_grad` is its control.
"""

from __future__ import annotations

import pytest
import torch

from ..probes import capabilities
from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_float8_training_linear_evaluates_like_the_linear(recipe: str, mode: str) -> None:
    pytest.importorskip("torchao.float8")
    why = capabilities.scaled_mm("cpu", "rowwise" if recipe.startswith("rowwise") else "tensorwise")
    if why:  # torch 2.11's CPU _scaled_mm takes tensorwise scales only: probed, not read off a version
        pytest.skip(why)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False))
    f8 = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False))
    f8.load_state_dict(plain.state_dict())
    convert_to_float8_training(f8, config=Float8LinearConfig.from_recipe_name(recipe))
    x = torch.randn(2, 16, 64)
    with getattr(torch, mode)():
        expected, got = plain(x), f8(x)
    assert got.shape == expected.shape
    err = float((got.float() - expected).abs().max())
    assert err <= 0.1 * float(expected.abs().max()), f"{recipe} under {mode}: off by {err:.3g}"


@pytest.mark.world_size(2)
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_float8_tp_styles_evaluate_like_the_linears(dist, mode: str) -> None:
    """The tensorwise face under TP: torchao's Float8ColwiseParallel / Float8RowwiseParallel
    cast their input to a Float8 training tensor and wrap it with DTensor.from_local, whose
    `view_as` reaches the Float8 tensor undecomposed under inference_mode: "attempting to
    run aten.view_as.default, this is not supported". `no_grad` is the control."""
    pytest.importorskip("torchao.float8")
    from torch.distributed.tensor.parallel import parallelize_module
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.Linear(128, 64, bias=False))
    f8 = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.Linear(128, 64, bias=False))
    f8.load_state_dict(plain.state_dict())
    convert_to_float8_training(f8, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    parallelize_module(f8.to(dist.device), dist.mesh(), {"0": Float8ColwiseParallel(), "1": Float8RowwiseParallel()})
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1)).to(dist.device)
    with getattr(torch, mode)():
        expected, got = plain.to(dist.device)(x), f8(x)
    got = got.full_tensor() if hasattr(got, "full_tensor") else got
    assert got.shape == expected.shape
    err = float((got.float() - expected).abs().max())
    assert err <= 0.1 * float(expected.abs().max()), f"tensorwise TP under {mode}: off by {err:.3g}"
