"""torchao Float8 tensorwise training on an empty tensor raises (pytorch/ao#1938's root cause).

Trigger: a Float8Linear (tensorwise recipe) whose input has no rows: an MoE expert that
no token was routed to in this microbatch. torchao's `tensor_to_amax` is
`torch.max(torch.abs(x))`, which raises "max(): Expected reduction dim to be specified for
input.numel() == 0" on an empty tensor, where a plain nn.Linear returns an empty output
and a zero weight gradient. ao#1938 reports the same line reached through FSDP2 (a
weight shard of shape [0, in_features] when ranks outnumber out_features). Found by the
scenario fuzzer (seed 2026-12-02, torch 2.13.0 and 2.15.0), shrunk to
`tp-moe-eager-f8_tensorwise` at the smallest sizes; the table had no MoE x Float8 row.
One process, no collectives: the bug is in the cast, not in the parallelism.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


@pytest.mark.parametrize("tokens", [8, 0])
def test_float8_linear_takes_an_empty_batch_like_a_linear(tokens: int) -> None:
    pytest.importorskip("torchao.float8")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False))
    f8 = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False))
    f8.load_state_dict(plain.state_dict())
    convert_to_float8_training(f8, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    x = torch.randn(tokens, 64)
    ref_in, f8_in = x.clone().requires_grad_(), x.clone().requires_grad_()
    plain(ref_in).sum().backward()
    out = f8(f8_in)
    out.sum().backward()
    assert out.shape == (tokens, 128)
    grad, ref = f8[0].weight.grad, plain[0].weight.grad
    assert torch.isfinite(grad).all(), f"{tokens} tokens: a non-finite weight gradient"
    # float8 rounding: the gradient matches to a few percent of its scale (exactly 0 when empty)
    assert float((grad - ref).abs().max()) <= 0.05 * float(ref.abs().max()) + 1e-6
