"""Trains a drawn model structure on the ranks and as its single-process reference, and
judges the pair with the suites' own judges (checks.check_numerics, the float32
tolerances) and localization (localize.py).

Both sides run the same loop over the same global batches: the reference on every row,
a data-parallel rank on its own rows (each rank's loss is its rows' mean, so the averaged
gradients equal the reference's), a TP rank on every row. Plain SGD: its update is linear
in the gradient, so a gradient bug shows in the next step's numbers as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..judges.checks import check_numerics
from ..runner.evidence import TrainRecord, full_grads
from ..judges.localize import Divergence, Trace, Tracer, first_divergence, gather_trace
from ..judges.tolerances import tolerance
from . import model_structures as ms
from .model_space import complete


@dataclass
class Judged:
    """What one structure's run came to: the checks' problems and where it first diverged."""

    problems: list[str]
    divergence: Divergence | None


def _train(structure: dict[str, Any], runnable, model, batches, rank: int, world_size: int, dp: bool,
           tracer: Tracer, gather: bool) -> tuple[TrainRecord, dict]:
    import torch.distributed as dist

    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=ms.LR)
    opt.register_step_pre_hook(lambda *args: ms.update_expert_bias(model))
    record, traces = TrainRecord(), {}
    for step, micro in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for m, (tokens, labels) in enumerate(micro):
            if dp:
                rows = slice(rank * ms.BATCH_PER_RANK, (rank + 1) * ms.BATCH_PER_RANK)
                tokens, labels = tokens[rows], labels[rows]
            with tracer.tracing():
                logits = runnable(tokens)
                loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()) / len(micro)
                loss.backward()
            total += loss.detach().float().cpu()
            events = tracer.take()
            traces[(step, m)] = gather_trace(events) if gather else events
        if gather and dp and world_size > 1:
            dist.all_reduce(total)
            total /= world_size
        record.losses.append(float(total))
        record.grads.append(full_grads(model))
        opt.step()
    return record, traces


def judge(structure: dict[str, Any], rank: int, world_size: int, mesh: Any, device: torch.device,
          plant=None) -> Judged:
    """Trains the structure both ways on this rank; every rank returns the same judgement."""
    structure = complete(structure)
    dp = ms.data_parallel(structure["parallel"])
    reference = ms.build(structure, device)
    batches = ms.data(structure, reference.vocab, world_size)
    ref_tracer = Tracer(reference)
    ref_record, ref_events = _train(structure, reference, reference, batches, 0, world_size, False, ref_tracer, False)
    model = ms.build(structure, device)
    runnable = ms.parallelize(model, mesh)
    if plant is not None:
        plant(model, structure["parallel"], rank)
    run_record, run_parts = _train(structure, runnable, model, batches, rank, world_size, dp, Tracer(model), True)
    problems = check_numerics(ref_record, run_record, tolerance("float32", "none"))
    divergence = None
    if problems:
        divergence = first_divergence(Trace(ref_events), run_parts, dp, world_size, torch.float32,
                                      ref_record.grads, run_record.grads)
    return Judged(problems, divergence)
