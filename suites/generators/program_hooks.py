"""Round later_hook's calls on both twins (distci/program_forms.py LATER_FORMS_HOOK says which
trainers make each): the EMA of the weights after a step (step=ema), the two-call and the foreach
clip (clip=total_norm, clip=foreach), and the optimizer stepped inside backward (fwd_bwd=inbwd).

The reference makes each on the full model, as the run does on its own, with one exception that
is the point of the form: under fwd_bwd=inbwd the reference steps after its backward and drops
its gradients (optimizer.step(); zero_grad(set_to_none=True)), which is what stepping each
parameter in its hook computes for an optimizer whose update of a parameter reads that
parameter's gradient and state alone (every optimizer of program_optimizers.py). A run whose
hooks fire on the wrong gradient (a rank's local one, an unreduced shard) or never fire leaves it.
The EMA copies are compared after every action by program_judge.compare.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ..runner.evidence import clean_name

DECAY = 0.5
"""The EMA's decay: far from 1, so one step's weights move the average visibly at float32."""
CLIP_MAX_NORM = 1.0
"""clip=total_norm / clip=foreach clip at clip=1.0's bound (they are its forms)."""


def missing(actions: tuple[str, ...]) -> str | None:
    """Why this stack cannot make one of the round's calls in `actions` (None: it can)."""
    if "clip=total_norm" in actions and not hasattr(torch.nn.utils, "get_total_norm"):
        return "clip=total_norm: this torch has no torch.nn.utils.get_total_norm (torch >= 2.6)"
    if any(a in actions for a in ("step=ema", "eval=ema")):
        from torch.optim import swa_utils

        if not hasattr(swa_utils, "get_ema_multi_avg_fn"):
            return "step=ema: this torch has no torch.optim.swa_utils.get_ema_multi_avg_fn"
    return None


class Shadow:
    """The EMA of an FSDP2 model: a copy of each rank's own shards (DTensors) and buffers, lerped
    toward the model's with one `torch._foreach_lerp_` over the list (timm ModelEmaV3's foreach
    update, the sharded shadow of trainers that keep EMA under FSDP2, tnt's AutoUnit EMA sharded
    as its model). Why not AveragedModel here: it deepcopies the model, and FSDP2 refuses to be
    deepcopied by design (`_unimplemented_deepcopy`: "use state dict"), so an AveragedModel of an
    FSDP2 module is no call a trainer can make. The same update as get_ema_multi_avg_fn's: the
    first copies, each later one lerps by 1 - DECAY."""

    def __init__(self, named: dict[str, torch.Tensor], stale: bool = False) -> None:
        self.named = {n: t.detach().clone() for n, t in named.items()}
        self.n_averaged = 1
        self.stale = {n: t.detach().clone() for n, t in named.items()} if stale else None
        """The ema_stale_shard plant's copy (program_plants.py): the weights of the last update."""

    def update(self, named: dict[str, torch.Tensor]) -> None:
        names = [n for n, t in self.named.items() if t.is_floating_point()]
        toward = self.stale if self.stale is not None else {n: t.detach() for n, t in named.items()}
        torch._foreach_lerp_([self.named[n] for n in names], [toward[n] for n in names], 1 - DECAY)
        if self.stale is not None:
            self.stale = {n: t.detach().clone() for n, t in named.items()}
        self.n_averaged += 1


def entries(twin: Any) -> dict[str, torch.Tensor]:
    """The EMA's parameters and buffers by the full model's names (twin.named's)."""
    if isinstance(twin.ema, Shadow):
        return dict(twin.ema.named)
    module = twin.ema.module
    return {clean_name(n): t for n, t in (*module.named_parameters(), *module.named_buffers())}


def _state(twin: Any) -> dict[str, torch.Tensor]:
    return {**twin.named, **{clean_name(n): b for n, b in twin.model.named_buffers()}}


def average(twin: Any, sharded: bool, stale: bool = False) -> None:
    """step=ema's update after the step: an AveragedModel(model, multi_avg_fn=
    get_ema_multi_avg_fn(DECAY), use_buffers=True) made at the first (a deepcopy: under TP it
    holds DTensors), then update_parameters(model); a Shadow where `sharded` (FSDP2)."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    if sharded and twin.ema is None:
        twin.ema = Shadow(_state(twin), stale)
    elif sharded:
        twin.ema.update(_state(twin))
    else:
        if twin.ema is None:
            twin.ema = AveragedModel(twin.model, multi_avg_fn=get_ema_multi_avg_fn(DECAY), use_buffers=True)
        twin.ema.update_parameters(twin.model)


@contextlib.contextmanager
def swapped_in(twin: Any) -> Iterator[torch.nn.Module]:
    """eval=ema: the module whose forward runs on the EMA weights: the AveragedModel's copy, or
    for a Shadow the model itself with the EMA shards copied into its parameters and buffers and
    its own copied back after (Lightning WeightAveraging's swap for validation)."""
    if not isinstance(twin.ema, Shadow):  # evaluated as the model is: in eval mode, its buffers left alone
        twin.ema.module.eval()
        try:
            yield twin.ema.module
        finally:
            twin.ema.module.train()
        return
    state = _state(twin)
    kept = {n: t.detach().clone() for n, t in state.items()}
    with torch.no_grad():
        for n, t in state.items():
            t.copy_(twin.ema.named[n])
    try:
        yield twin.runnable
    finally:
        with torch.no_grad():
            for n, t in state.items():
                t.copy_(kept[n])


def clip(params: list[torch.Tensor], arg: str) -> torch.Tensor:
    """clip=total_norm / clip=foreach on `params`; returns the total norm the clip used."""
    if arg == "foreach":
        return torch.nn.utils.clip_grad_norm_(params, CLIP_MAX_NORM, foreach=True, error_if_nonfinite=True)
    grads = [q.grad for q in params]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if hasattr(total, "full_tensor"):  # torchtitan: the DTensor norm made full before clipping with it
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, CLIP_MAX_NORM, total)
    return total


@contextlib.contextmanager
def stepping_in_backward(twin: Any) -> Iterator[None]:
    """fwd_bwd=inbwd on the run: while the backward runs, each trained parameter's
    post-accumulate-grad hook steps the optimizer (its gradient the only one held then: the
    backward starts with none, and each hook drops its own) and drops the gradient."""
    def hook(param: torch.Tensor) -> None:
        twin.opt.step()
        param.grad = None

    handles = [q.register_post_accumulate_grad_hook(hook) for q in twin.named.values() if q.requires_grad]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def step_after_backward(twin: Any) -> None:
    """fwd_bwd=inbwd on the reference: what stepping in backward computes (module docstring)."""
    twin.opt.step()
    twin.opt.zero_grad(set_to_none=True)
