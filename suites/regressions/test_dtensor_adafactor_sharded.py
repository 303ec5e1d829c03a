"""torch.optim.Adafactor steps a sharded DTensor wrongly: a matrix raises, a vector moves
by another amount than the full tensor's step (2 ranks).

Trigger: a parameter sharded on one mesh axis (FSDP2's Shard(0), a TP plan's Shard(0) or
Shard(1)) and `torch.optim.Adafactor(...).step()` (Hugging Face Trainer's `optim="adafactor"`;
torchtune takes any torch.optim class). Adafactor's factored second moment reduces the
gradient over one dim (`torch.norm(grad, dim=-1 | -2, keepdim=True).square_()`): over the
sharded dim the norm is a `_NormPartial` DTensor and the in-place `square_` refuses it ("aten.pow_.Scalar:
in-place operations that require placement changes are not supported"), for rows (Shard(1))
and columns (Shard(0)) alike. Found by the programs generator's `later_optim` round
(`fsdp-ws2-w8-l1-adafactor:fwd_bwd,step`, every sharded layout) on torch 2.13.0 and 2.15.0, CPU.

A vector (FSDP2 shards biases and norms too) takes the unfactored path, which raises nothing
but scales its step by `param.norm(2).item()` and `update.norm(2).item()`: `.item()` of a
partial norm is the rank's own shard's norm (pytorch#166638, open), so each rank moves its
shard by its own factor: `test_adafactor_steps_a_sharded_vector_as_the_full_one` is that
issue's face, in its own entry. A replicated DTensor is the control: it steps as the full
tensor does (0 difference).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
LR = 1e-2


def _step(dist, shape: tuple[int, ...], placement: str, foreach: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the full tensor after one Adafactor step, the DTensor's after the same step, gathered)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)
    full, grad = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
    ref = torch.nn.Parameter(full.clone())
    ref.grad = grad.clone()
    torch.optim.Adafactor([ref], lr=LR, foreach=foreach).step()
    where = [Replicate()] if placement == "replicate" else [Shard(int(placement[-1]))]
    par = torch.nn.Parameter(distribute_tensor(full.clone().to(dist.device), dist.mesh(), where))
    par.grad = distribute_tensor(grad.clone().to(dist.device), dist.mesh(), where)
    torch.optim.Adafactor([par], lr=LR, foreach=foreach).step()
    return ref.detach(), par.detach().full_tensor().cpu()


@pytest.mark.world_size(2)
@pytest.mark.parametrize("foreach", [False, True], ids=["loop", "foreach"])
@pytest.mark.parametrize("placement", ["shard0", "shard1", "replicate"])
def test_adafactor_steps_a_sharded_matrix_as_the_full_one(dist, placement: str, foreach: bool) -> None:
    ref, got = _step(dist, (8, 8), placement, foreach)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-7), \
        f"Adafactor on a {placement} matrix: max |diff| {(got - ref).abs().max():.3g} from the full step"


@pytest.mark.world_size(2)
@pytest.mark.parametrize("placement", ["shard0", "replicate"])
def test_adafactor_steps_a_sharded_vector_as_the_full_one(dist, placement: str) -> None:
    ref, got = _step(dist, (8,), placement, False)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-7), \
        f"Adafactor on a {placement} vector: max |diff| {(got - ref).abs().max():.3g} from the full step"
