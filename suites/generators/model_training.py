"""Trains a drawn model structure on the ranks and as its single-process reference, and
judges the pair with the suites' own judges (checks.check_numerics, the float32
tolerances) and localization (localize.py).

Both sides run the same loop over the same global batches: the reference on every row,
a data-parallel rank on its own rows, a TP rank on every row, a rank of fsdp_tp on its
dp_shard group's rows, a pipeline every row in its microbatches (model_pipeline.py). The loss
is the `loss` feature's on both sides (model_batches.py: each shard's mean, the reference the
mean of the shards' means; or the summed loss over the step's valid tokens, all-reduced over the
data-parallel ranks on the parallel side), so the reduced gradients equal the reference's; under
loss_parallel it is computed from vocab-sharded logits inside `loss_parallel()`, as torchtitan's
train step does. Plain SGD: its update is linear in the gradient, so a gradient bug shows in
the next step's numbers as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..judges.checks import check_numerics
from ..runner.evidence import TrainRecord, full_grads
from ..judges.localize import Divergence, Trace, Tracer, first_divergence, gather_trace
from ..judges.tolerances import tolerance
from . import model_batches as mb
from . import model_structures as ms
from .model_compile import graphs, not_compiled
from .model_pipeline import Pipelined, reference_loss, tp_merged
from .model_space import PIPELINED, complete


@dataclass
class Judged:
    """What one structure's run came to: the checks' problems and where it first diverged."""

    problems: list[str]
    divergence: Divergence | None


def _train(structure: dict[str, Any], runnable, model, batches, rows: tuple[int, int] | None,
           tracer: Tracer, gather: bool, shards: int = 1, dp_group: Any = None) -> tuple[TrainRecord, dict]:
    """`rows`: (this rank's data-parallel shard, shards), None: every row (the reference, with
    `shards` the parallel run's, computes the loss as that run defines it: model_batches).
    `dp_group`: where the step's valid tokens are summed (None: every rank, each its own rows)."""
    import torch.distributed as dist

    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=ms.LR)
    opt.register_step_pre_hook(lambda *args: ms.update_expert_bias(model))
    count = getattr(model, "count_tokens", mb.valid_tokens)
    record, traces = TrainRecord(), {}
    for step, micro in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        if rows is not None:
            micro = [(tokens.chunk(rows[1])[rows[0]], labels.chunk(rows[1])[rows[0]]) for tokens, labels in micro]
        step_valid = sum(count(labels) for _, labels in micro)
        if gather and rows is not None and dist.get_world_size() > 1:  # torchtitan: dist_sum over the batch mesh
            dist.all_reduce(step_valid, group=dp_group)
        for m, (tokens, labels) in enumerate(micro):
            with tracer.tracing(), ms.loss_context(structure, gather):
                logits = runnable(tokens)
                if structure["parallel"] in PIPELINED:  # the pipelined step's loss, on the whole batch
                    loss = reference_loss(structure, logits, labels) / len(micro)
                elif gather:
                    loss = mb.parallel_loss(structure, logits, labels, step_valid, shards, len(micro))
                else:
                    loss = mb.reference_loss(structure, logits, labels, step_valid, shards, len(micro))
                loss.backward()
            local = loss.detach()
            total += (local.full_tensor() if hasattr(local, "full_tensor") else local).float().cpu()
            events = tracer.take()
            traces[(step, m)] = gather_trace(events) if gather else events
        if gather and rows is not None and dist.get_world_size() > 1:  # a TP group's ranks hold equal losses
            dist.all_reduce(total)
            total = mb.recorded(structure, total / dist.get_world_size(), shards)
        record.losses.append(float(total))
        record.grads.append(full_grads(model))
        opt.step()
    return record, traces


def judge(structure: dict[str, Any], rank: int, world_size: int, mesh: Any, device: torch.device,
          plant=None) -> Judged:
    """Trains the structure both ways on this rank; every rank returns the same judgement."""
    structure = complete(structure)
    dp = ms.data_parallel(structure["parallel"])
    groups = ms.dp_groups(structure, mesh)
    reference = ms.build(structure, device)
    batches = ms.data(structure, reference.vocab, world_size)
    ref_tracer = Tracer(reference)
    shards = len(groups) if dp else 1
    ref_record, ref_events = _train(structure, reference, reference, batches, None, ref_tracer, False, shards)
    compiled_before = graphs()
    if structure["parallel"] in PIPELINED:
        return _judge_pipelined(structure, device, batches, ref_record, ref_events, plant, rank, mesh,
                                compiled_before)
    model = ms.build(structure, device)
    runnable = ms.parallelize(model, mesh)
    if structure["loss"] == "tokens":
        mb.divide_by_sum(model)
    if plant is not None:
        plant(model, structure["parallel"], rank)
    mine = next(i for i, group in enumerate(groups) if rank in group)
    dp_group = mesh.get_group("dp_shard") if structure["parallel"] == "fsdp_tp" else None
    run_record, run_parts = _train(structure, runnable, model, batches, (mine, len(groups)) if dp else None,
                                   Tracer(model), True, shards, dp_group)
    problems = check_numerics(ref_record, run_record, tolerance("float32", "none"))
    problems += not_compiled(structure, compiled_before)
    divergence = None
    if problems:
        firsts = [group[0] for group in groups] if dp else list(range(world_size))
        parts = {k: [ranks[r] for r in firsts] for k, ranks in run_parts.items()}  # one rank per row shard
        divergence = first_divergence(Trace(ref_events), parts, dp, len(firsts), torch.float32,
                                      ref_record.grads, run_record.grads)
    return Judged(problems, divergence)


def _judge_pipelined(structure: dict[str, Any], device: torch.device, batches, ref_record: TrainRecord,
                     ref_events: dict, plant, rank: int, mesh: Any = None, compiled_before: int = 0) -> Judged:
    """parallel=pp, pp_fsdp or pp_tp: the stages train under their schedule (model_pipeline.py);
    a module's microbatch outputs (pp_fsdp: every pipeline's; pp_tp: each rebuilt from its tp
    shards first), put back together along the batch, are its full-batch output."""
    piped = Pipelined(structure, device, mesh)
    if plant is not None:
        plant(piped, structure["parallel"], rank)
    run_record, run_parts = piped.train(batches)
    problems = check_numerics(ref_record, run_record, tolerance("float32", "none"))
    problems += not_compiled(structure, compiled_before)
    divergence = None
    if problems:
        if piped.tp:
            run_parts = tp_merged(run_parts, ref_events)
        divergence = first_divergence(Trace(ref_events), run_parts, True, piped.grad_divisor, torch.float32,
                                      ref_record.grads, run_record.grads)
    return Judged(problems, divergence)
