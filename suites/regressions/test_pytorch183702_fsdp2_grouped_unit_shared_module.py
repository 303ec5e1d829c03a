"""FSDP2: a grouped unit `fully_shard([norm, mtp, output])` whose members share a module (the MTP
module holds the output head) cannot be wrapped by the root (pytorch#183702).

Trigger: `fully_shard([model.norm, model.mtp, model.output])` where `model.mtp.head is
model.output` (DeepSeek-V3 / Megatron-LM multi-token prediction reuses the output head), then
`fully_shard(model)` as every trainer wraps its root. The root takes the head's parameters,
already DTensors of the grouped unit, for a second time: torch 2.13.0 and 2.15.0 raise "Cannot
concatenate overlapping meshes" (a mesh with dim names, as trainers build) or "Invariant
encountered: value was None" (an unnamed mesh). Upstream reports the same grouping failing in
backward. torchtitan groups `[model.norm, model.output]` the same way; the models generator draws
it as `fsdp-mtp-wrap_grouped`. Control: the same model with the head wrapped first, then the
norm and the MTP module as their own units.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


class _MTP(nn.Module):
    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8, bias=False)
        self.head = head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(h))


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.output = nn.Linear(8, 4, bias=False)
        self.mtp = _MTP(self.output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.emb(x))
        return self.output(h).sum() + 0.3 * self.mtp(h).sum()


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("grouped", [True, False], ids=["grouped_unit", "separate_units_control"])
def test_root_wraps_a_model_whose_grouped_unit_shares_the_head(dist, grouped: bool) -> None:
    from ..runner.fsdp import fsdp_api

    fully_shard, _ = fsdp_api()
    mesh = dist.mesh()
    torch.manual_seed(0)
    model, reference = _Model(), _Model()
    reference.load_state_dict(model.state_dict())
    if grouped:
        fully_shard([model.norm, model.mtp, model.output], mesh=mesh)
    else:
        for unit in (model.output, model.norm, model.mtp):
            fully_shard(unit, mesh=mesh)
    try:
        fully_shard(model, mesh=mesh)
    except (RuntimeError, TypeError) as exc:
        pytest.fail(f"fully_shard(root) after the {'grouped' if grouped else 'separate'} units raised: "
                    f"{type(exc).__name__}: {exc}")
    x = torch.randn(2 * dist.world_size, 8, generator=torch.Generator().manual_seed(1))
    rows = x.shape[0] // dist.world_size
    model(x[dist.rank * rows:(dist.rank + 1) * rows]).backward()
    reference(x).backward()
    got = model.output.weight.grad.full_tensor()
    torch.testing.assert_close(got, reference.output.weight.grad / dist.world_size)
