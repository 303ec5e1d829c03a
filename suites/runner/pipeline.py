"""Pipeline parallel rows: torch.distributed.pipelining schedules over the model's blocks.

The model is cut as torchtitan's pipeline split does: stage 0 holds the embeddings and
the first blocks, the last stage the last blocks, the final norm and the output
projection; each stage is the seed-built model with the other stages' modules removed,
so parameter names stay those of the full model. Single-stage schedules (GPipe, 1F1B)
put one stage on every rank; the interleaved ones (Interleaved1F1B, the interleaved
zero-bubble schedule) two per rank, rank r holding stages r and r + ranks; the V-shaped
ones (ZBV, DualPipeV) two per rank as a V, rank r holding stages r and 2 * ranks - 1 - r
(torchtitan's `_get_pp_rank_to_stage_indices_mapping`). Microbatches
are the row's `accum`; the schedule averages the microbatches' gradients
(`scale_grads`), so a correct run matches the reference's full-batch step.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", 2),
    "zero_bubble": ("ScheduleInterleavedZeroBubble", 2),
    "zbv": ("ScheduleZBVZeroBubble", 2),
    "dualpipev": ("ScheduleDualPipeV", 2),
}
"""schedule column value -> (torch.distributed.pipelining class, stages per rank)."""
V_SHAPED = ("zbv", "dualpipev")
"""Schedules whose rank r holds stages r and n_stages - 1 - r (the first and last on rank 0)."""


def stage_indices(schedule: str, rank: int, ranks: int) -> list[int]:
    """The stages pipeline rank `rank` of `ranks` holds under `schedule` (torchtitan's mapping)."""
    per_rank = SCHEDULES[schedule][1]
    if schedule in V_SHAPED:
        return [rank, ranks * per_rank - 1 - rank]
    return [rank + k * ranks for k in range(per_rank)]


@dataclass
class Pipeline:
    """This rank's part of a pipeline: its stage modules and the schedule that runs them."""

    schedule: Any
    stages: list[int]
    n_stages: int
    owner: dict[str, int]
    """Parameter name -> the pipeline rank holding it (every rank knows every name's owner;
    empty when the caller split the model itself)."""
    group: Any = None
    """The pipeline's process group (None: every rank is a pipeline rank)."""
    last_rank: int | None = None
    """The pipeline rank holding the last stage (None: (n_stages - 1) % ranks, a loop schedule)."""
    pipeline_stages: list = field(default_factory=list)
    """This rank's PipelineStage objects, in the order of `stages`."""

    @property
    def first(self) -> bool:
        return 0 in self.stages

    @property
    def last(self) -> bool:
        return self.n_stages - 1 in self.stages


def stage_of(name: str, n_layers: int, n_stages: int) -> int:
    """The stage a parameter of the full model belongs to."""
    if name.startswith("layers."):
        return int(name.split(".")[1]) * n_stages // n_layers
    return 0 if name.startswith("tok_embeddings.") else n_stages - 1


def cut(model: nn.Module, stage: int, n_stages: int) -> nn.Module:
    """The model with every module outside `stage` removed (set to None / deleted)."""
    n_layers = len(model.layers)
    for i in list(model.layers.keys()):
        if int(i) * n_stages // n_layers != stage:
            del model.layers[i]
    if stage != 0:
        model.tok_embeddings = None
    if stage != n_stages - 1:
        model.norm = None
        model.output = None
    return model


def build(schedule: str, build_model: Callable[[], nn.Module], loss_fn: Callable, n_microbatches: int,
          device: torch.device, group: Any = None, sum_microbatches: bool = False,
          prepare: Callable[[nn.Module], None] | None = None,
          split: Callable[[int, int], nn.Module] | None = None) -> tuple[Pipeline, list[nn.Module]]:
    """This rank's stages (fresh seed-built models, cut) and the schedule over them.

    `group`: the pipeline ranks (the `pp` dim of a 2-D mesh; None: all ranks).
    `prepare`: parallelizes each cut stage in place before it becomes a PipelineStage
    (FSDP2 or TP inside the stage, as torchtitan's pipeline_llama then parallelize_llama).
    `sum_microbatches`: the microbatches' gradients are summed, not averaged (`scale_grads=False`:
    a mutation of the table's rows; torchtitan's loss, a sum over the step's token count).
    `split(stage, n_stages)`: stage `stage`'s module (default: `build_model()` cut here)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, schedules

    name, per_rank = SCHEDULES[schedule]
    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    n_stages = ranks * per_rank
    mine = stage_indices(schedule, rank, ranks)
    modules = [cut(build_model(), s, n_stages) if split is None else split(s, n_stages) for s in mine]
    for m in modules:
        if prepare is not None:
            prepare(m)
    stages = [PipelineStage(m, s, n_stages, device, group=group) for m, s in zip(modules, mine)]
    cls = getattr(schedules, name)
    kwargs: dict[str, Any] = {"n_microbatches": n_microbatches, "loss_fn": loss_fn}
    if "scale_grads" not in inspect.signature(cls.__init__).parameters:  # older torch: sums the microbatches
        if not sum_microbatches:
            kwargs["loss_fn"] = lambda out, target: loss_fn(out, target) / n_microbatches
    elif sum_microbatches:
        kwargs["scale_grads"] = False
    runner = cls(stages[0] if per_rank == 1 else stages, **kwargs)
    owner = {}
    if split is None:
        n_layers = len(build_model().layers)
        owner = {n: stage_of(n, n_layers, n_stages) % ranks for n, _ in build_model().named_parameters()}
    last_rank = next(r for r in range(ranks) if n_stages - 1 in stage_indices(schedule, r, ranks))
    return Pipeline(runner, mine, n_stages, owner, group, last_rank, stages), modules


def forward_backward(pipe: Pipeline, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One pipelined forward + backward of this rank's batch; returns its mean loss on every
    rank of the pipeline."""
    import torch.distributed as dist

    group = pipe.group
    losses: list[torch.Tensor] = []
    args = (tokens,) if pipe.first else ()
    kwargs = {"target": labels, "losses": losses} if pipe.last else {}
    pipe.schedule.step(*args, **kwargs)
    # under loss_parallel each loss is a Replicate DTensor: its local value is the loss
    losses = [x.to_local() if hasattr(x, "to_local") else x for x in losses]
    loss = torch.stack([x.detach().float() for x in losses]).mean() if pipe.last else torch.zeros((), device=tokens.device)
    last_rank = (pipe.n_stages - 1) % dist.get_world_size(group) if pipe.last_rank is None else pipe.last_rank
    dist.broadcast(loss, src=dist.get_global_rank(group, last_rank) if group is not None else last_rank, group=group)
    return loss


class Stages(nn.Module):
    """This rank's stage modules as one module: its parameters are the rank's parameters,
    under the full model's names (what the optimizer, clipping and the checks see)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(modules)

    def named_parameters(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        for part in self.parts:
            yield from part.named_parameters(*args, **kwargs)
