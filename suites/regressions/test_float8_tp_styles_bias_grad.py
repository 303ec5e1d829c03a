"""torchao's Float8 TP styles compute a linear's bias gradient from a float8-rounded gradient.

Trigger: a torchao Float8Linear with a bias (tensorwise), sharded with torchao's
Float8ColwiseParallel (or Float8RowwiseParallel), the styles torchtitan's tensorwise float8 TP
plan uses. The styles' `_prepare_output_fn` applies NoopFwToFloat8BwDynamic to the module's
OUTPUT: in backward the output's gradient is cast to float8 before it reaches the linear, so the
bias add's backward (the column sum of that gradient) sums float8-rounded values. One process's
Float8Linear, and the same Float8Linear under the plain ColwiseParallel, cast the output
gradient inside the float8 matmul's autograd function, after the bias add: their bias gradient
is the sum of the high-precision gradient ("we want gradients to be in high precision unless
specified otherwise by the float8 recipe", float8_experimental#255). Every other gradient agrees
(the weight's and the input's use the float8 gradient on both sides). Silent: about 23 dB of
SQNR where sum order alone gives > 130 dB.

Found while measuring what float8 runs on CPU for the programs generator's `tp_f8` layout (issue
40's float8 round, torch 2.13.0 and 2.15.0 CPU, torchao 0.18.0, emulated, 2026-12-07:
reports/fuzz-programs-2026-12-07-float8.md); torchtitan's models have no bias in these linears,
so its own runs never show it; Hugging Face models with biased projections (GPT-2, Qwen2's
q/k/v) under torchao's TP styles do. Searched pytorch/ao and torchtitan (float8 TP styles, bias,
NoopFwToFloat8BwDynamic): none. Draft: reports/upstream-draft-float8-tp-styles-bias-grad.md.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ..conftest import tier_marks
from ..judges.checks import sqnr

pytestmark = tier_marks("nightly")


def _bias_and_weight_sqnr(dist, style: str) -> tuple[float, float]:
    """(bias gradient SQNR, weight gradient SQNR) of a TP-sharded biased Float8Linear against
    the same Float8Linear in one process, on the same batch."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16))
    convert_to_float8_training(ref, config=Float8LinearConfig(emulate=dist.device_type != "cuda"))
    run = copy.deepcopy(ref)
    colwise, rowwise = {"float8_styles": (Float8ColwiseParallel, Float8RowwiseParallel),
                        "plain_styles_control": (ColwiseParallel, RowwiseParallel)}[style]
    parallelize_module(run, dist.mesh(), {"0": colwise(), "1": rowwise()})
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    ref(x).pow(2).mean().backward()
    run(x).pow(2).mean().backward()
    bias = min(sqnr(ref[i].bias.grad, run[i].bias.grad.full_tensor()) for i in (0, 1))
    weight = min(sqnr(ref[i].weight.grad, run[i].weight.grad.full_tensor()) for i in (0, 1))
    return bias, weight


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("style", ["float8_styles", "plain_styles_control"])
def test_a_tp_sharded_float8_linear_gets_its_bias_gradient_in_high_precision(dist, style: str) -> None:
    pytest.importorskip("torchao.float8")
    bias, weight = _bias_and_weight_sqnr(dist, style)
    assert weight >= 60.0, f"{style}: the weight gradient is off too ({weight:.1f} dB): not this bug"
    assert bias >= 60.0, (
        f"{style}: the bias gradient is {bias:.1f} dB from one process's Float8Linear (weights {weight:.1f} dB): "
        "summed from the float8-cast output gradient")
