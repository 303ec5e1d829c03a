"""The first suite: a tensor-parallel MLP against the same MLP on one process.

The smallest thing TP can get wrong: w1 column-sharded, w2 row-sharded, one all-reduce
in forward and one in backward. Run eager and with the whole model compiled, for a few
optimizer steps; loss and every gradient (gathered with full_tensor()) must match the
unsharded reference, and a compiled run must really have compiled (one graph, no
recompiles). It runs in seconds, so it is also what the harness benchmark times.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from .judges.checks import check_numerics, require
from .conftest import tier_marks
from .scenario.devices import suite_device
from .runner.parallelize import CompileCounter
from .judges.tolerances import tolerance
from .runner.evidence import TrainRecord, full_grads

DIM, HIDDEN, TOKENS, STEPS, SEED = 32, 64, 16, 3, 7


@dataclass(frozen=True)
class MLPCase:
    compile: str  # none | model
    backend: str  # none | eager | aot_eager | inductor
    optim: str  # sgd | adamw
    tier: str

    @property
    def id(self) -> str:
        mode = "eager" if self.compile == "none" else f"compile_{self.backend}"
        return f"{mode}-{self.optim}"


CASES = [
    MLPCase("none", "none", "sgd", "pr"),
    MLPCase("none", "none", "adamw", "pr"),
    MLPCase("model", "aot_eager", "sgd", "pr"),
    MLPCase("model", "inductor", "sgd", "pr"),
    MLPCase("model", "inductor", "adamw", "nightly"),
]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


def _train(model: nn.Module, params_of: nn.Module, optim: str, device: torch.device,
           counter: CompileCounter | None = None) -> tuple[TrainRecord, int]:
    """STEPS optimizer steps on seeded data; also returns the graphs compiled by step one."""
    gen = torch.Generator().manual_seed(SEED + 1)
    opt = (torch.optim.SGD(params_of.parameters(), lr=0.1) if optim == "sgd"
           else torch.optim.AdamW(params_of.parameters(), lr=1e-2))
    record, graphs_after_first = TrainRecord(), 0
    dtype = next(params_of.parameters()).dtype
    for step in range(STEPS):
        x = torch.randn(TOKENS, DIM, generator=gen).to(device, dtype)
        target = torch.randn(TOKENS, DIM, generator=gen).to(device, dtype)
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x).float(), target.float())
        loss.backward()
        record.losses.append(float(loss.detach().cpu()))
        record.grads.append(full_grads(params_of))
        opt.step()
        if step == 0 and counter is not None:
            graphs_after_first = counter.graphs
    return record, graphs_after_first


@pytest.mark.world_size(2)
@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.dist_timeout(600), *tier_marks(c.tier)]) for c in CASES]
)
def test_tp_mlp(dist, case: MLPCase) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dtype = suite_device(dist.device_type).dtype
    torch.manual_seed(SEED)
    reference = MLP().to(dist.device, getattr(torch, dtype))
    model = copy.deepcopy(reference)
    ref_record, _ = _train(reference, reference, case.optim, dist.device)

    parallelize_module(model, dist.mesh(), {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    counter = CompileCounter(case.backend) if case.compile == "model" else None
    runnable = torch.compile(model, backend=counter, fullgraph=True) if counter else model
    record, graphs_after_first = _train(runnable, model, case.optim, dist.device, counter)

    problems = check_numerics(ref_record, record, tolerance(dtype, "none"))
    if counter is not None:
        if graphs_after_first != 1:
            problems.append(f"{graphs_after_first} graphs compiled in the first step, expected 1 "
                            "(0: the compiled model silently ran eager)")
        if counter.graphs != graphs_after_first:
            problems.append(f"{counter.graphs - graphs_after_first} recompiles after the first step, expected 0")
    require(problems, f"TP MLP {case.id} on {dist.world_size} {dist.device_type} ranks ({dtype})")
