"""DCP resume of a stateless optimizer into other parameter groups raises (2 ranks; not filed yet).

Trigger: a plain-TP model (ColwiseParallel / RowwiseParallel linears, the norm a plain
replicated tensor) whose optimizer keeps DTensor and plain parameters in separate groups
(the foreach kernels cannot mix them; suites/runner/step.py's `param_groups`), saved with
dcp.save, then resumed into a layout that groups them otherwise (here an unsharded copy
with one group, as `resume='single'`; tp_sp and FSDP2 have every parameter a DTensor, one
group too) through dcp.load + set_optimizer_state_dict. The saved `param_groups` are
keyed by parameter FQN and torch's `_split_optim_state_dict` re-groups them by FQN into the
loading optimizer's groups, but it first returns the state dict unchanged when every key
of its `state` is an int, which is vacuously true for an empty `state`: a stateless
optimizer (SGD without momentum, distci's default optimizer) then reaches
`Optimizer.load_state_dict` with the saved groups' FQN lists, positionally, and raises
"loaded state dict contains a parameter group that doesn't match the size of optimizer's
group" (dcp.load has already written the saved group 0's FQN list into the loading
optimizer's one group). The same load with SGD momentum or AdamW (the controls: they have
state) re-groups and passes; so does a resume whose groups match (tp_sp -> single, one
group each). No TP is needed upstream: one process, two groups saved, one loaded, fails the
same way (reports/upstream-draft-dsd-stateless-optimizer-regroup.md).
Found by the scenario fuzzer (seed 2026-12-02, torch 2.13.0 and 2.15.0) as
`tp-eager-ga2-loss_parallel-dcp_to_tp_sp-zg_zeros`, reduced to `tp-eager-dcp_to_single`.
"""

from __future__ import annotations


import pytest
import torch
from torch import nn

from ..conftest import tier_marks
from ..runner.checkpoint import shared_dir

pytestmark = tier_marks("nightly")
DIM = 16
OPTIMIZERS = {
    "sgd": lambda groups: torch.optim.SGD(groups, lr=0.1),
    "sgd_momentum": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9),
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=0.01),
}


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(DIM)
        self.w1 = nn.Linear(DIM, 2 * DIM, bias=False)
        self.w2 = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.w1(self.norm(x)))


def _by_kind(model: nn.Module) -> list[dict]:
    """DTensor parameters in one group, plain ones in another (what foreach needs under TP)."""
    groups: dict[bool, list] = {}
    for p in model.parameters():
        groups.setdefault(hasattr(p, "placements"), []).append(p)
    return [{"params": ps} for ps in groups.values()]


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int, device) -> None:
    x = torch.randn(4, DIM, generator=torch.Generator().manual_seed(seed)).to(device)
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    opt.step()


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


@pytest.mark.world_size(2)
@pytest.mark.parametrize("optim", list(OPTIMIZERS))
def test_tp_checkpoint_resumes_into_one_group(dist, optim: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    tp, single = _Block().to(dist.device), _Block().to(dist.device)
    single.load_state_dict(tp.state_dict())
    parallelize_module(tp, dist.mesh(), {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    tp_opt = OPTIMIZERS[optim](_by_kind(tp))
    assert len(tp_opt.param_groups) == 2, "the TP model should have DTensor and plain parameters"
    _step(tp, tp_opt, 1, dist.device)
    with shared_dir() as where:
        dcp.save({"model": get_model_state_dict(tp), "optim": get_optimizer_state_dict(tp, tp_opt)},
                 checkpoint_id=where)
        single_opt = OPTIMIZERS[optim]([{"params": list(single.parameters())}])
        state = {"model": get_model_state_dict(single), "optim": get_optimizer_state_dict(single, single_opt)}
        dcp.load(state, checkpoint_id=where)
        set_model_state_dict(single, state["model"])
        set_optimizer_state_dict(single, single_opt, state["optim"])
    # the resumed run goes on exactly as the saved one does
    _step(tp, tp_opt, 2, dist.device)
    _step(single, single_opt, 2, dist.device)
    for (name, p), q in zip(tp.named_parameters(), single.parameters()):
        assert torch.allclose(_full(p).detach().cpu(), q.detach().cpu(), rtol=1e-5, atol=1e-6), \
            f"{optim}: {name} differs after the resumed step"
