"""torchao Float8 rowwise training linears under torch.inference_mode() raise (ao#643, rowwise face).

Trigger: a model converted with `convert_to_float8_training` under a rowwise recipe
(`rowwise`, `rowwise_with_gw_hp`), a 3-D input (batch, seq, dim) and an eval forward
under `torch.inference_mode()`: `aten.linear` is CompositeImplicitAutograd, inference mode
skips the Autograd key that decomposes it, so the Float8 training tensor receives
`aten.reshape` and its axiswise (rowwise) scaling asserts "aten.reshape.default with
axiswise scaling is not supported yet". ao#643 (closed by ao#659, which added `reshape`)
was the tensorwise face; tensorwise passes here (the control), as does `no_grad()`.
Found by the scenario fuzzer (seed 2026-12-02, torch 2.13.0 and 2.15.0, torchao 0.18.0) as
`*-f8_rowwise*-eval_inference`; the table had no Float8 x eval row. One process.
"""

from __future__ import annotations

import pytest
import torch

from .. import capabilities
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
