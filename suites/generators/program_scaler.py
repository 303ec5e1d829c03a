"""Loss scaling in the programs generator: the `LAYOUT_amp` layouts' torch.amp.GradScaler and
`fwd_bwd=spike` (distci/program_forms.py, LATER_FORMS_AMP), on both twins.

As accelerate (`Accelerator.backward`, `clip_grad_norm_`, AcceleratedOptimizer.step, `save_state`'s
scaler.pt), Hugging Face Trainer (fp16=True) and Lightning's MixedPrecision plugin ("16-mixed",
under its FSDP and ModelParallel strategies) train fp16: every backward runs on
`scaler.scale(loss)`; a clip first calls `scaler.unscale_(optimizer)` (once a step); the step is
`scaler.step(optimizer)` (skipped when unscale_ found an inf or nan in any gradient) then
`scaler.update()` (the scale halves after a skipped step, doubles after `growth_interval` good
ones); the scaler's state_dict is saved by rank 0 beside the checkpoint and loaded on every rank
on resume. Under FSDP2 and TP the gradients are DTensors, and GradScaler's
`_amp_foreach_non_finite_check_and_unscale_` all-reduces `found_inf` over their mesh (pytorch
PR #132816): every rank must skip the step with the rank that overflowed, or it diverges for good.
The reference twin runs its own GradScaler on the full model; after every call the judge compares
the two scalers' scale and growth tracker, whether the last step was skipped, and that every rank
holds the same scaler state (`problems`), besides the parameters and optimizer state it always
compares.

Why float32 and not fp16 autocast. The programs are judged at float32's tolerance against a
reference that computes as the run does (program_judge.py); under fp16 the layouts round
differently (TP's row-wise linear splits the contraction, FSDP's ranks sum their rows apart), so
no bound would hold for AdamW after a few steps, nor for which steps overflow at the edge of
fp16's range. GradScaler's own logic (scale, unscale, the inf check, skip, backoff, growth,
state_dict) does not depend on the gradients' dtype, so the scaler trains float32 here and the
overflow is made as fp16 runs meet one, by an outlier batch (`fwd_bwd=spike`): data-parallel
rank 0's loss multiplied by SPIKE before it is scaled, so its scaled gradients are inf or nan
whatever the scale has fallen to (below); or by a corrupt sample (`fwd_bwd=badlabel`, an inf
target), whose overflow stays in one rank's shard of the head where only the head trains.
Borderline overflows (one element near float32's
largest value) are left out on purpose: the run's local gradients are dp_size times its
averaged ones, so at the edge a correct run and the reference may disagree on the skip, which
no reference can judge (suites/runner/step.py found the same for its fp16 spike).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

INIT_SCALE = 2.0 ** 16
"""GradScaler's default init_scale (fp16's first steps overflow at it and back off)."""
GROWTH_INTERVAL = 2
"""Good steps before the scale doubles: GradScaler's default (2000) never moves inside a program
of at most 14 calls, and a resume must restore a growth tracker and a scale that moved."""
SPIKE = 2.0 ** 127
"""The outlier batch's loss factor. The gradient of the spiked loss is scale * SPIKE / dp_size
before any model term, past float32's largest value (2**128) while the scale is at least
2 * dp_size = 8: it starts at 2**16 and halves once per skipped step, so it stays >= 2**8 over a
program's at most 8 spiked steps. The scaled gradients are then inf or nan on every side."""
ACROSS_RANKS = "GradScaler differs across ranks"
"""The words of the problem that the ranks' scalers disagree (the judge stops there)."""
FILE = "scaler.pt"
"""The scaler's state beside the checkpoint (accelerate's save_state name), written by rank 0."""


@dataclass
class Scaling:
    """A twin's GradScaler and where its step stands."""

    scaler: Any
    unscaled: bool = False
    """unscale_ ran since the last step (a second call before update() raises)."""
    skipped: bool | None = None
    """Whether the last step was skipped (None: no step yet)."""
    saved: Any = None
    """The reference's state_dict at its last save (the run reads its file back)."""


class _LocalInfCheck(torch.amp.GradScaler):
    """The found_inf_local plant (program_plants.py): the inf check and unscale over each
    gradient's local shard, its found_inf never agreed across the ranks (DTensor's all-reduce
    of it left out, as a scaler that predates pytorch PR #132816 would)."""

    def _unscale_grads_(self, optimizer: Any, inv_scale: torch.Tensor, found_inf: torch.Tensor,
                        allow_fp16: bool) -> dict:
        grads = [getattr(q.grad, "_local_tensor", q.grad) for group in optimizer.param_groups
                 for q in group["params"] if q.grad is not None]
        if grads:
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        return {found_inf.device: found_inf}


def new(device_type: str, local_inf_check: bool = False) -> Scaling:
    """A GradScaler as the trainers make it (the growth interval above). Its scale is made by
    the first scale() call, and step() before one raises; a program may step before its first
    backward, so a scale() of a zero makes it at once (the scale and tracker as a fresh one's).
    `local_inf_check`: the found_inf_local plant's scaler."""
    cls = _LocalInfCheck if local_inf_check else torch.amp.GradScaler
    scaler = cls(device_type, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    scaler.scale(torch.zeros((), device=device_type))
    return Scaling(scaler)


def backward(twin: Any, loss: torch.Tensor) -> None:
    """`loss.backward()`, through the twin's scaler if it trains with one."""
    (loss if twin.scaling is None else twin.scaling.scaler.scale(loss)).backward()


def reference_spike(out: torch.Tensor, y: torch.Tensor, dp_size: int, rows: int) -> torch.Tensor:
    """What the reference backpropagates for `fwd_bwd=spike`: the mean of the data-parallel ranks'
    losses with rank 0's (its first `rows` rows) times SPIKE, from one forward of the global batch
    (one training forward moves the model's buffer once, as each rank's does)."""
    if dp_size == 1:
        return F.mse_loss(out, y) * SPIKE
    first, rest = F.mse_loss(out[:rows], y[:rows]), F.mse_loss(out[rows:], y[rows:])
    return (first * SPIKE + rest * (dp_size - 1)) / dp_size


def bad_labels(y: torch.Tensor) -> torch.Tensor:
    """`fwd_bwd=badlabel`'s targets: the global batch's first (data-parallel rank 0's first
    row's first) target an inf, a corrupt sample. Its gradient is inf in that output's row of
    the head whatever the scale, and reaches the rest of the model only through the head's
    input gradient (so not where the blocks are frozen)."""
    bad = y.clone()
    bad[0, 0] = float("inf")
    return bad


def unscale(p: Any) -> None:
    """`scaler.unscale_(optimizer)` on both twins before a clip, once a step."""
    for twin in (p.ref, p.run):
        if twin.scaling is not None and not twin.scaling.unscaled:
            twin.scaling.scaler.unscale_(twin.opt)
            twin.scaling.unscaled = True


def step(twin: Any) -> None:
    """`scaler.step(optimizer)` then `scaler.update()`; records whether the step was skipped
    (the scale falls only after a skipped step)."""
    s = twin.scaling
    before = s.scaler.get_scale()
    s.scaler.step(twin.opt)
    s.scaler.update()
    s.skipped, s.unscaled = s.scaler.get_scale() < before, False


def clip_totals(p: Any, totals: tuple[float, float]) -> tuple[float, float] | None:
    """The clip's total norms to judge: none where both twins' are inf or nan (a spiked step's
    unscaled gradients: the scaler then skips the step on both, which `problems` judges)."""
    if p.ref.scaling is not None and not any(map(torch.isfinite, map(torch.tensor, totals))):
        return None
    return totals


def overflowed(ref: dict, run: dict) -> tuple[dict, dict, list[str]]:
    """The gradients the judge compares by value, and the problems of those it does not: a
    gradient the reference holds inf or nan in (an overflowed step) agrees with a run's that
    does too, whatever its values (inf, or nan where an inf met another, by the reductions'
    order); a finite one there is a problem. A non-finite run gradient where the reference's
    is finite stays for the value check, which reports it."""
    problems = []
    keep_ref, keep_run = dict(ref), dict(run)
    for name, r in ref.items():
        if r is None or bool(torch.isfinite(r).all()):
            continue
        g = keep_run.pop(name, None)
        keep_ref.pop(name)
        if g is not None and bool(torch.isfinite(g).all()):
            problems.append(f"GradScaler: gradient {name} is finite where the reference's overflowed")
    return keep_ref, keep_run, problems


def problems(p: Any) -> list[str]:
    """The run's scaler against the reference's, and every rank's against the others'
    (collective: every rank of a program that trains with a scaler calls it)."""
    import torch.distributed as tdist

    ref, run = p.ref.scaling, p.run.scaling
    if ref is None:
        return []
    out = []
    if run.skipped != ref.skipped and ref.skipped is not None:
        where = "the run" if run.skipped else "the reference"
        out.append(f"GradScaler: the step was skipped in {where} only")
    a, b = ref.scaler.state_dict(), run.scaler.state_dict()
    for key, what in (("scale", "scale"), ("_growth_tracker", "growth tracker")):
        if a[key] != b[key]:
            out.append(f"GradScaler {what} {b[key]:g} vs reference {a[key]:g}")
    mine = (b["scale"], b["_growth_tracker"], run.skipped)
    every: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(every, mine)
    if len(set(every)) > 1:
        out.append(f"{ACROSS_RANKS}: (scale, growth tracker, skipped) by rank {every}")
    return out


def save(p: Any) -> None:
    """The scaler's state beside the checkpoint: the reference's kept, the run's written by
    rank 0 into the checkpoint directory (every rank's scaler holds the same state)."""
    import torch.distributed as tdist

    if p.ref.scaling is None:
        return
    p.ref.scaling.saved = copy.deepcopy(p.ref.scaling.scaler.state_dict())
    if tdist.get_rank() == 0:
        torch.save(p.run.scaling.scaler.state_dict(), os.path.join(p.checkpoint_dir, FILE))
    tdist.barrier()


def load(p: Any) -> None:
    """The scaler's state read back on every rank, as accelerate's load_state does."""
    if p.ref.scaling is None:
        return
    p.ref.scaling.scaler.load_state_dict(p.ref.scaling.saved)
    if p.plant.keeps_scaler_on_load(p.spec.layout):
        return
    p.run.scaling.scaler.load_state_dict(torch.load(os.path.join(p.checkpoint_dir, FILE), weights_only=True))
