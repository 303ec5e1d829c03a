"""torch.compile of a model under composable `replicate()` (torchtitan's `apply_ddp`), 2 ranks.

Trigger: `replicate(model, bucket_cap_mb=1)` on two 1 MiB linears, then `torch.compile`
(Dynamo's DDPOptimizer, the default `optimize_ddp`). DDPOptimizer splits the compiled graph
at DDP's bucket boundaries, so each bucket's all-reduce starts while the rest of the backward
runs. It only acts when `DistributedDataParallel._active_ddp_module` is set, which
DistributedDataParallel's forward does and composable replicate's did not
(pytorch#169461): the model compiles to one graph and every gradient waits for the whole
backward. The numbers stay right; only the structure shows it, as the scenario rows'
graph count did ("1 graphs compiled in the first step, expected 2..2" on every
replicate-compile_model row, torch 2.10.0 CPU, fixes off, 2026-12-05). Fixed by pytorch PR
174307 (merged 2026-02-09): 2.12.1 and 2.13.0 pass. DistributedDataParallel is the control.
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


class TwoLinears(torch.nn.Module):
    """User code (Dynamo skips torch.nn's own frames, such as Sequential.forward, when DDP's
    graph break makes the inner forward a frame of its own)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.first = torch.nn.Linear(width, width)
        self.second = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("api", ["ddp_control", "replicate"])
def test_compiled_replicate_splits_its_graph_at_the_buckets(dist, api: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    width = 512  # 1 MiB of float32 weights per linear: two buckets at bucket_cap_mb=1
    model = TwoLinears(width).to(dist.device)
    if api == "replicate":
        from torch.distributed._composable.replicate import replicate

        replicate(model, bucket_cap_mb=1)
        runnable: torch.nn.Module = model
    else:
        runnable = DistributedDataParallel(model, bucket_cap_mb=1)
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(1 + dist.rank)).to(dist.device)
    runnable(x).sum().backward()
    eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    graphs: list[torch.fx.GraphModule] = []

    def counting(gm: torch.fx.GraphModule, example_inputs):  # DDPOptimizer calls it per bucket
        graphs.append(gm)
        return gm.forward

    before = DistributedDataParallel._get_active_ddp_module()
    torch._dynamo.reset()
    try:
        torch.compile(runnable, backend=counting)(x).sum().backward()
    finally:
        DistributedDataParallel._active_ddp_module = before  # never leak it into later compiles
    for p, want in zip(model.parameters(), eager):
        torch.testing.assert_close(p.grad, want)
    assert len(graphs) >= 2, (f"{api}: the compiled model is {len(graphs)} graph(s) for DDP's 2 buckets of 1 MiB: "
                              "DDPOptimizer did not split it (no all-reduce overlaps the backward)")
