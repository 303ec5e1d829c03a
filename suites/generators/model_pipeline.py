"""The models generator's pipeline layout (parallel=pp): a drawn structure cut into stages
and trained by a torch.distributed.pipelining schedule, as torchtitan's `pipeline_llm`
does it (suites/runner/pipeline.py owns the schedules and the stage placement).

What trainers do, and what this does:
  - the split: torchtitan's `_generate_llm_fqn_per_model_part` (the embedding and the head
    each weigh one block) or a hand-written `module_fqns_per_model_part` putting every block
    on the first or the last stage (model_space.stage_blocks); each stage is the seed-built
    model with the other stages' modules removed (`_split_module`: None for the ends, the
    blocks left out), so parameter names stay the full model's;
  - the loss: a per-microbatch mean with the schedule's `scale_grads` (the pipelining
    tutorial), or torchtitan's sum over the step's tokens with `scale_grads=False`;
  - gradient accumulation: one `schedule.step` per accumulation microbatch (torchtitan's
    train step), the loss divided by their count;
  - a tied embedding and head: the first stage holds the embedding, the last the head, two
    copies; their gradients are summed over the pipeline before the optimizer step and both
    copies take the sum (Megatron-LM's `_allreduce_word_embedding_grads`; torch's pipelining
    has no tied-weight support of its own).

pp_fsdp (torchtitan's PP x FSDP2): a 2x2 ("pp", "dp_shard") mesh; each stage is
`fully_shard`ed over dp_shard (the drawn wrap, through pipeline.build's `prepare`, as
torchtitan's parallelize runs on every stage module) and each dp_shard index's pipeline
trains on its own rows; the schedule's PipelineStage keeps FSDP2 from resharding and
reduce-scattering per microbatch (its `set_reshard_after_backward` /
`set_requires_gradient_sync` handling), and FSDP2's reduce-scatter averages the groups.

pp_tp (torchtitan's PP x TP): a 2x2 ("pp", "tp") mesh; each stage is laid out by the
drawn plan over "tp" (model_plans.apply_plan through `prepare`, as torchtitan's
parallelize_llama runs on every stage module), so the tensors stages send are the plan's
local outputs (plan=titan: sequence shards) and, under loss_parallel, the schedule's loss
and backward run on the last stage's vocab-sharded DTensor logits inside `loss_parallel()`
(torchtitan's train context wraps `pp_schedule.step`). Every tp index's pipeline trains on
the same rows; a tied pair's copies, sharded alike over "tp" (or whole), are summed over
"pp" shard by shard.

Localization: every event is recorded under the microbatch (the schedule's chunk id) that
produced it, so a module's outputs over the microbatches put back together are its
full-batch output (localize.combine, the data-parallel way).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..judges.localize import Tracer, combine
from ..runner import pipeline
from ..runner.evidence import TrainRecord, full_grads, gathered
from . import model_structures as ms
from .model_batches import valid_tokens
from .model_space import PIPELINED, complete, stage_blocks

TIED = ("tok.weight", "output.weight")
"""A tied pair's two names: the first stage's copy and the last stage's."""


def cut(model: ms.StructureModel, stage: int, blocks: list[list[int]]) -> ms.StructureModel:
    """`model` as stage `stage` of `len(blocks)`: its blocks and ends, the rest gone."""
    last = len(blocks) - 1
    model.running = list(blocks[stage])
    for i in range(len(model.layers)):
        if i not in model.running:
            model.layers[i] = nn.Identity()
    if stage != 0:
        model.tok = None
    if stage != last:
        model.norm, model.output, model.mtp = None, None, None
    return model


class ChunkTracer(Tracer):
    """A Tracer whose events are kept per microbatch: `chunk` is set while the stage runs a
    microbatch's forward or backward (`watch`); a forward outside them (the schedule's first
    step runs one to infer the shapes its stages send) is not the training's and is dropped."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.chunk: int | None = None
        self.by_chunk: dict[int, tuple[list, dict]] = {}

    def _record(self, kind: str, name: str, t: torch.Tensor) -> None:
        if self.chunk is None:
            return
        self.current, self.calls = self.by_chunk.setdefault(self.chunk, ([], {}))
        super()._record(kind, name, t)

    def take_chunks(self) -> dict[int, list]:
        out = {chunk: events for chunk, (events, _) in self.by_chunk.items()}
        self.by_chunk = {}
        return out


def watch(stage: Any, tracer: ChunkTracer) -> None:
    """Tells `tracer` which microbatch `stage` runs (its chunk id, the first argument)."""
    for name in ("forward_one_chunk", "backward_one_chunk"):
        run = getattr(stage, name)

        def tagged(chunk_id: int, *args: Any, _run=run, **kwargs: Any) -> Any:
            tracer.chunk = chunk_id
            try:
                return _run(chunk_id, *args, **kwargs)
            finally:
                tracer.chunk = None
        setattr(stage, name, tagged)


def _sum_tied(modules: list[ms.StructureModel], group: Any = None, local_rows: int | None = None) -> None:
    """Both copies of a tied weight take the sum of their gradients over the pipeline (every
    rank of `group`, the pipeline, joins the sum; one holding neither end adds zeros of the
    local shard's shape: `local_rows`, when the copies are DTensors, its vocab rows)."""
    import torch.distributed as dist

    copies = [p for m in modules for n, p in m.named_parameters() if n in TIED and p.requires_grad]
    if (copies and hasattr(copies[0], "to_local")) or (not copies and local_rows is not None):
        # pp_fsdp, pp_tp: both copies DTensors sharded alike (Shard(0) over dp_shard / tp, or Replicate)
        total = torch.zeros_like(copies[0].to_local()) if copies else torch.zeros(local_rows, ms.DIM)
        for p in copies:
            if p.grad is not None:  # a gradient may come out in another placement (pp_tp: the embedding's)
                if p.grad.placements != p.placements:
                    p.grad = p.grad.redistribute(p.device_mesh, p.placements)
                total += p.grad.to_local()
        dist.all_reduce(total, group=group)
        for p in copies:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.to_local().copy_(total)
        return
    vocab = ms.VOCAB + 1 if modules[0].structure["uneven"] else ms.VOCAB
    total = torch.zeros(vocab, ms.DIM)
    for p in copies:
        if p.grad is not None:
            total += p.grad.to(total.device)
    dist.all_reduce(total, group=group)
    for p in copies:
        p.grad = total.to(p.device).clone()


class Pipelined:
    """This rank's stages of a structure, its schedule, and how it trains."""

    def __init__(self, structure: dict[str, Any], device: torch.device, mesh: Any = None) -> None:
        """`mesh`: pp_fsdp's ("pp", "dp_shard") or pp_tp's ("pp", "tp") mesh (pp: unused, every rank a
        pipeline rank)."""
        import torch.distributed as dist

        s = self.structure = complete(structure)
        self.blocks = stage_blocks(s)
        self.tokens_loss = s["pp_loss"] == "tokens"
        self.sum_tied = True
        """False only under a plant (model_plants.pp_tied_unsummed)."""
        self.valid_tokens = 0
        """The valid tokens of the batch being run: torchtitan's token loss divides by them."""

        self.fsdp = s["parallel"] == "pp_fsdp"
        self.tp = s["parallel"] == "pp_tp"
        world = dist.get_world_size()
        self.groups = ms.dp_groups(s, mesh) if self.fsdp else [list(range(world))]
        """The ranks of each dp_shard index's pipeline, in row order (pp, pp_tp: one, every rank)."""
        self.shard = next(i for i, g in enumerate(self.groups) if dist.get_rank() in g)
        self.pp_group = mesh["pp"].get_group() if self.fsdp or self.tp else None
        self.tied_group = self.pp_group
        """Where the tied copies' gradients are summed (moved only by a plant: model_plants)."""
        self.tp_ranks = [[int(r) for r in column] for column in mesh.mesh.T] if self.tp else None
        """pp_tp: each tp index's pipeline (all on the same rows), the first one's ranks first."""

        def split(stage: int, n_stages: int) -> nn.Module:
            module = cut(ms.build(s, device), stage, self.blocks)
            if not self.tp:  # torchtitan: compile each stage's blocks before FSDP2 (pp_tp: after the plan)
                ms.compile_blocks(module)
            return module

        def prepare(stage: nn.Module) -> None:  # torchtitan: FSDP2 over dp_shard inside every stage
            ms.apply_fsdp(stage, mesh["dp_shard"], s["wrap"])

        def prepare_tp(stage: nn.Module) -> None:  # torchtitan: the TP plan over "tp" inside every stage
            from .model_plans import apply_plan

            apply_plan(stage, mesh["tp"], s["plan"], s["loss_parallel"])
            ms.compile_blocks(stage)

        self.pipe, self.modules = pipeline.build(s["schedule"], lambda: None, self._loss, s["microbatches"], device,
                                                 group=self.pp_group, sum_microbatches=self.tokens_loss, split=split,
                                                 prepare=prepare if self.fsdp else prepare_tp if self.tp else None)
        self.tied_rows = _tied_rows(s, mesh)
        self.model = pipeline.Stages(self.modules)
        # the step's token counts summed over the pipelines (each saw its own rows)
        self.model.balance_groups = [mesh["dp_shard"].get_group()] if self.fsdp and s["balance"] else []
        self.tracers = [ChunkTracer(m) for m in self.modules]
        self.stages = self.pipe.pipeline_stages
        """This rank's PipelineStage objects, in the order of `modules`."""
        for stage, tracer in zip(self.stages, self.tracers):
            watch(stage, tracer)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat, target = logits.float().flatten(0, 1), labels.flatten()
        if self.tokens_loss:  # torchtitan: a sum over the step's tokens, scale_grads=False
            loss = F.cross_entropy(flat, target, reduction="sum") / self.valid_tokens
        else:
            loss = F.cross_entropy(flat, target)
        return loss / self.structure["accum"]

    @property
    def grad_divisor(self) -> int:
        """What a microbatch's output gradients carry beyond the reference's: the microbatch
        count, when the schedule scales the parameter gradients afterwards; times the pipelines
        (pp_fsdp: each one's loss is its own rows' mean, FSDP2 averages them)."""
        scaled = getattr(self.pipe.schedule, "scale_grads", False)
        return (self.structure["microbatches"] if scaled else 1) * len(self.groups)

    def train(self, batches: list) -> tuple[TrainRecord, dict]:
        """The drawn steps; per (step, accumulation microbatch), every pipeline microbatch's
        events from every rank, in microbatch order."""
        import torch.distributed as dist

        params = [p for p in self.model.parameters() if p.requires_grad]
        # a rank whose stages train nothing (a frozen embedding alone) has no optimizer: torch.optim
        # refuses an empty parameter list; the balancing bias still moves at its step
        opt = torch.optim.SGD(params, lr=ms.LR) if params else None
        if opt is not None:
            opt.register_step_pre_hook(lambda *args: ms.update_expert_bias(self.model))
        record, traces = TrainRecord(), {}
        tied = self.structure["tie"] and self.structure["frozen"] == "none"
        for step, micro in enumerate(batches):
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            total = torch.zeros(())
            for m, (tokens, labels) in enumerate(micro):
                shards = len(self.groups)
                tokens, labels = tokens.chunk(shards)[self.shard], labels.chunk(shards)[self.shard]
                self.valid_tokens = int(valid_tokens(labels))  # the pipeline's batch, pads left out
                with _tracing(self.tracers), ms.loss_context(self.structure, self.tp):
                    loss = pipeline.forward_backward(self.pipe, tokens, labels)
                total += loss.float().cpu() * (self.structure["microbatches"] if self.tokens_loss else 1)
                mine: dict[int, list] = {}
                for tracer in self.tracers:
                    for chunk, events in tracer.take_chunks().items():
                        mine.setdefault(chunk, []).extend(events)
                every: list = [None] * dist.get_world_size()
                dist.all_gather_object(every, mine)
                chunks = range(self.structure["microbatches"])
                if self.tp:  # per microbatch, each tp index's pipeline: tp_merged rebuilds the plan's shards
                    traces[(step, m)] = [[[e for r in ranks for e in every[r].get(c, [])] for ranks in self.tp_ranks]
                                         for c in chunks]
                else:
                    traces[(step, m)] = [[e for r in group for e in every[r].get(c, [])]
                                         for group in self.groups for c in chunks]
            if tied and self.sum_tied:
                _sum_tied(self.modules, self.tied_group, self.tied_rows)
            if self.fsdp:  # every rank of a pipeline holds its loss: the mean over the pipelines
                dist.all_reduce(total)
                total /= dist.get_world_size()
            record.losses.append(float(total))
            grads = gathered(full_grads(self.model))
            if self.structure["tie"]:
                grads.pop("output.weight", None)  # the head's copy of tok.weight
            record.grads.append(grads)
            if opt is not None:
                opt.step()
            else:
                ms.update_expert_bias(self.model)
        return record, traces


def _tied_rows(s: dict[str, Any], mesh: Any) -> int | None:
    """The vocab rows of this rank's shard of a tied copy sharded on the vocab (pp_fsdp:
    FSDP2's Shard(0) over dp_shard; pp_tp under plan=titan: the embedding's and the head's
    Shard(0) over tp), for a rank holding neither copy; None: the copies stay whole."""
    axis = {"pp_fsdp": "dp_shard", "pp_tp": "tp" if s["plan"] == "titan" else None}.get(s["parallel"])
    if axis is None or not s["tie"]:
        return None
    vocab = ms.VOCAB + 1 if s["uneven"] else ms.VOCAB
    return torch.arange(vocab).chunk(mesh[axis].size())[mesh[axis].get_local_rank()].numel()


def tp_merged(run_parts: dict, ref_events: dict) -> dict:
    """pp_tp's trace as the data-parallel combine reads it: per (step, microbatch), per
    pipeline microbatch, one event list whose tensors are whole, each rebuilt from the tp
    indices' parts (a plan's local output, e.g. a sequence shard) by localize.combine
    against the reference's shape with the microbatch's rows."""
    merged: dict = {}
    for at, chunks in run_parts.items():
        ref = dict(ref_events.get(at, []))
        merged[at] = []
        for per_tp in chunks:
            by_key: dict = {}
            for events in per_tp:
                for k, t in events:
                    by_key.setdefault(k, []).append(t)
            out = []
            for k, parts in by_key.items():
                like = ref.get(k)
                if like is None or not parts[0].dim():
                    out.append((k, parts[0]))
                    continue
                shape = (parts[0].shape[0], *like.shape[1:])
                whole = combine(parts[:1], torch.empty(shape), False)  # replicated: the first index's
                if whole is None:
                    whole = combine(parts, torch.empty(shape), False)
                if whole is not None:
                    out.append((k, whole))
            merged[at].append(out)
    return merged


def _tracing(tracers: list[ChunkTracer]):
    import contextlib

    stack = contextlib.ExitStack()
    for tracer in tracers:
        stack.enter_context(tracer.tracing())
    return stack


def reference_loss(structure: dict[str, Any], logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The full-batch loss a pipelined step computes: with a per-microbatch mean, the mean of
    the microbatches' means (torch.tensor_split's chunks, as the schedule splits the batch:
    equal to the batch mean when the count divides it); torchtitan's token sum, the batch mean.
    pp_fsdp: the mean over the pipelines, each on its own rows, under either loss: each pipeline
    divides its token sum by its own rows' valid tokens (`Pipelined._loss`) and FSDP2 averages
    the pipelines, so with padded rows the pipelines' counts differ and the mean of their means
    is not the batch mean (the batch mean here filed pp_fsdp-ga2-pp_loss_tokens-padded, whose
    pipelines held 10 and 13 valid tokens, as a divergence at the head's output gradient)."""
    s = complete(structure)
    flat = logits.float()
    if s["parallel"] == "pp_fsdp":
        parts = list(zip(flat.chunk(ms.PP_DP_SHARD), labels.chunk(ms.PP_DP_SHARD)))
        return sum(reference_loss({**s, "parallel": "pp"}, x, y) for x, y in parts) / len(parts)
    if s["parallel"] not in PIPELINED or s["pp_loss"] == "tokens":
        return F.cross_entropy(flat.flatten(0, 1), labels.flatten())
    parts = zip(torch.tensor_split(flat, s["microbatches"]), torch.tensor_split(labels, s["microbatches"]))
    return sum(F.cross_entropy(x.flatten(0, 1), y.flatten()) for x, y in parts) / s["microbatches"]
