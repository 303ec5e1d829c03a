"""The parallel run of a scenario, and the evidence of what it did.

It starts from the same seed-built weights as the single-process reference
(suites/runner/reference.py) and sees the same global batches. It applies the scenario
(parallelize.py): data-parallel ranks take their slice of the global batch, split it
into `accum` microbatches and accumulate, so a correct run matches the reference's
full-batch step; the loss, clipping, optimizer and schedule are suites/runner/step.py's, as in
the reference; a `resume` row saves a DCP checkpoint mid-run and goes on under another
layout (checkpoint.py). Each step records the loss and every gradient (DTensor gradients
gathered with full_tensor()), and the run records what the compiler and the step really
did: graphs compiled, graph breaks, recompiles, the post-grad ops inductor emitted, the
ops and the collectives (with their dtypes) the last step executed, the parameters'
placements and which of them require grad.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.nn as nn

from . import checkpoint as ckpt
from . import parallelize as par
from . import step as stp
from . import tying
from .collectives import record_collectives
from .evidence import (Evidence, Mutation, TrainRecord, gathered, count_graph_breaks, clean_name, count_executed_ops,
                       full_grads, inductor_probe)
from .layout import Layout, as_meshes, build_layout, torch_dtype
from .models import is_frozen
from .routing import RoutingClock, gather_routing, steer, watch_routing
from ..scenario.record import RESUME_AT, Scenario

FSDP2_LAYOUTS = (*par.FSDP_LAYOUTS, "pp_fsdp", "ep_fsdp")
"""Layouts whose gradients FSDP2 reduces (their collective dtypes are recorded and judged)."""
TP_EVIDENCE_LAYOUTS = ("tp", "tp_sp", "fsdp_tp")
"""Layouts whose last step's collectives the runner records (a pipeline's are its schedule's)."""


def _clip(scenario: Scenario, layout: Layout, record: TrainRecord, mutation: "Mutation") -> None:
    """Clips as the row says; under EP the experts' gradients live on their owners only."""
    if scenario.clip == "none":
        return
    params = [p for p in layout.model.parameters() if p.requires_grad]
    experts = layout.ep is not None or scenario.parallel == "ep_fsdp"
    local = [p for n, p in layout.model.named_parameters() if ".experts." in n] if experts else []
    if layout.pipe is not None:
        local = params  # every gradient lives on the rank of its stage only
    norm = stp.clip_grads(params, scenario.clip, local_params=local, group=layout.local_group,
                          local_norm=mutation.clip_local_norm)
    record.grad_norms.append(float(norm.cpu()))


def _train_steps(scenario: Scenario, layout: Layout, data, steps: range, device, record: TrainRecord,
                 step_parts: stp.StepParts, mutation: "Mutation", on_step: Callable[[int], Any] | None = None,
                 clock: RoutingClock | None = None) -> None:
    """Steps of data-parallel, accumulated training; records the global loss and full grads."""
    import torch.distributed as dist

    for step in steps:
        tokens, labels = data[step]
        if layout.pipe is not None:
            _pipeline_step(scenario, layout, tokens, labels, device, record, step_parts, mutation,
                           on_step(step) if on_step else contextlib.nullcontext(),
                           watched=layout.watch is not None and layout.watch[0] == step, index=step)
            continue
        mb = tokens.shape[0] // (layout.dp_size * scenario.accum)  # rows per microbatch
        ctx = on_step(step) if on_step else contextlib.nullcontext()
        with ctx:
            step_parts.opt.zero_grad(set_to_none=scenario.zero_grad == "none")
            total = torch.zeros((), dtype=torch.float32, device=device)
            watched = layout.watch is not None and layout.watch[0] == step
            for micro in range(scenario.accum):
                start = (layout.dp_rank * scenario.accum + micro) * mb
                if clock is not None:
                    clock.step, clock.chunk = step, layout.dp_rank * scenario.accum + micro
                x, y = tokens[start:start + mb].to(device), labels[start:start + mb].to(device)
                # grad_sync=last: only the last microbatch reduces (FSDP2's set_requires_gradient_sync;
                # DDP's no_sync, replicate's set_requires_gradient_sync through layout.sync)
                sync_now = (scenario.grad_sync == "every" or micro == scenario.accum - 1
                            or mutation.sync_every_microbatch)
                if scenario.grad_sync == "last" and layout.sync is None:
                    layout.model.set_requires_gradient_sync(sync_now)
                with stp.loss_context(scenario), _cp_context(layout, x, y), \
                        layout.sync(sync_now) if layout.sync else contextlib.nullcontext(), \
                        record_collectives(layout.watch[1], functional=not scenario.compiled) if watched \
                        else contextlib.nullcontext():
                    with _autocast(layout, device, scenario):
                        loss = step_parts.loss(layout.runnable(x), y) / scenario.accum
                    stp.scaled(loss, step_parts.scaler, step, layout.dp_rank == 0 and micro == 0).backward()
                total += stp.full_value(loss).detach().float()
            if layout.dp_size > 1:
                dist.all_reduce(total, group=layout.dp_group)
                total /= layout.dp_size
            if layout.ep is not None:
                _average_ep_grads(layout.model, layout.dp_group, layout.dp_size)
            if layout.cp_mesh is not None:  # each rank's loss is the mean over its sequence shard
                cp_size = layout.cp_mesh.size()
                dist.all_reduce(total, group=layout.cp_mesh.get_group())
                total /= cp_size
                _average_ep_grads(layout.model, layout.cp_mesh.get_group(), cp_size)  # no experts: all averaged
        stp.unscale(step_parts)
        _clip(scenario, layout, record, mutation)
        record.losses.append(float(total.cpu()))
        grads = full_grads(layout.model, layout.ep)
        record.grads.append(gathered(grads) if layout.partial_params else grads)
        stp.optimizer_step(step_parts, step, record)
        if scenario.fsdp_float8_all_gather:
            par.precompute_float8_scales(layout.model)


def _cp_context(layout: Layout, tokens: torch.Tensor, labels: torch.Tensor):
    """A cp row's forward and backward: tokens, labels and the rotary table sharded over
    the sequence (torchtitan's `context_parallel` buffers), ring attention inside."""
    if layout.cp_mesh is None:
        return contextlib.nullcontext()
    from torch.distributed.tensor.experimental import context_parallel

    rope = getattr(layout.model, "rope")
    return context_parallel(layout.cp_mesh, buffers=[tokens, labels, rope], buffer_seq_dims=[1, 1, 0],
                            no_restore_buffers={tokens, labels})


def _autocast(layout: Layout, device, scenario: Scenario):
    if not layout.autocast:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch_dtype(scenario.compute_dtype or "bfloat16"))


def _pipeline_step(scenario: Scenario, layout: Layout, tokens, labels, device, record: TrainRecord,
                   step_parts: stp.StepParts, mutation: "Mutation", ctx: Any, watched: bool = False, index: int = 0) -> None:
    """One step of a pp row: the schedule runs every microbatch through the stages."""
    from . import pipeline

    import torch.distributed as dist

    rows = tokens.shape[0] // layout.dp_size  # pp_fsdp: each data-parallel rank pipelines its slice
    part = slice(layout.dp_rank * rows, (layout.dp_rank + 1) * rows)
    with ctx:
        step_parts.opt.zero_grad(set_to_none=scenario.zero_grad == "none")
        with record_collectives(layout.watch[1], functional=not scenario.compiled) if watched else contextlib.nullcontext():
            total = pipeline.forward_backward(layout.pipe, tokens[part].to(device), labels[part].to(device))
        if layout.dp_size > 1:
            dist.all_reduce(total, group=layout.dp_group)
            total /= layout.dp_size
    _clip(scenario, layout, record, mutation)
    record.losses.append(float(total.cpu()))
    record.grads.append(gathered(full_grads(layout.model)))
    stp.optimizer_step(step_parts, index)


def _average_ep_grads(model: nn.Module, group: Any, size: int) -> None:
    """Expert parallel's data-parallel half: dense gradients averaged over the ranks; an
    expert's gradient already sums every rank's tokens, so it is divided by the ranks."""
    import torch.distributed as dist

    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if ".experts." not in name:
            dist.all_reduce(p.grad, group=group)
        p.grad.div_(size)


def run_parallel(scenario: Scenario, mesh: Any, device: torch.device, dtype: str,
                 mutation: Mutation | None = None) -> tuple[TrainRecord, Evidence]:
    """The scenario's parallel run, with the evidence of what compiled and what executed.

    `mesh`: the harness's `dist.mesh` (a factory: 2-D rows and resume rows need other
    meshes than the 1-D one) or, for 1-D rows, a DeviceMesh.
    """
    mutation = mutation or Mutation()
    meshes = as_meshes(mesh)
    evidence = Evidence(compiled=scenario.compiled)
    dtype = scenario.train_dtype_override or dtype
    record = TrainRecord()
    data = stp.batches(scenario)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_config_for(scenario, evidence))
        if scenario.replicated:
            stack.enter_context(par.restoring_active_ddp_module())
        if scenario.parallel == "replicate" and scenario.compiled:
            import torch._dynamo.config as dynamo_config

            stack.enter_context(dynamo_config.patch(optimize_ddp="ddp_optimizer"))  # torchtitan's apply_ddp
        if mutation.dynamo_config:
            import torch._dynamo.config as dynamo_config

            stack.enter_context(dynamo_config.patch(mutation.dynamo_config))
        layout = build_layout(scenario, scenario.parallel, meshes, device, dtype, evidence, mutation)
        breaks_before = count_graph_breaks()
        last = scenario.steps - 1

        final = scenario.parallel if scenario.resume == "none" else scenario.resume
        watch = (last, evidence.collectives) if (final in FSDP2_LAYOUTS or final in TP_EVIDENCE_LAYOUTS) \
            and not scenario.fsdp_float8_all_gather else None  # FSDP2's and TP's collective dtypes (graph_checks)

        armed = [False]
        if watch is not None and scenario.fsdp and not scenario.compiled and scenario.resume == "none":
            _record_gather_order(layout.model, evidence, armed)

        @contextlib.contextmanager
        def last_step():
            armed[0] = True
            with count_executed_ops(evidence.runtime_ops,
                                    evidence.grad_all_reduces if layout.sync is not None else None):
                yield

        def on_step(step: int):
            counter = layout.counter
            if step == 1 and counter is not None:
                evidence.graphs_after_first_step = counter.graphs
            if counter is not None:
                evidence.graph_calls.append(-counter.calls)
            return last_step() if step == last else contextlib.nullcontext()

        clock = None
        if scenario.model_args.n_experts and not scenario.compiled and scenario.resume == "none":
            clock = RoutingClock()  # the routing of an eager MoE run is compared with the reference's
            watch_routing(layout.model, record, clock)
            steer(layout.model, scenario.routing, scenario.dp_degree * scenario.accum, clock)

        def train(layout: Layout, steps: range, parts: stp.StepParts) -> None:
            layout.watch = watch
            for step in steps:
                _train_steps(scenario, layout, data, range(step, step + 1), device, record, parts, mutation,
                             on_step, clock)
                if layout.counter is not None:
                    evidence.graph_calls[-1] += layout.counter.calls

        opt_watch = (last, evidence.optimizer_ops) if scenario.opt_impl in ("foreach", "fused") else None  # checks.py
        parts = stp.new_step_parts(scenario, layout.model, impl=mutation.optimizer_impl, scaler=mutation.grad_scaler)
        parts.watch = opt_watch
        if scenario.resume == "none":
            train(layout, range(scenario.steps), parts)
        else:
            train(layout, range(RESUME_AT), parts)
            with ckpt.shared_dir() as path:
                ckpt.save(layout.model, parts.opt, path, asynchronous=scenario.dcp == "async")
                ckpt.save_trainer_state(path, parts.sched, parts.scaler)
                layout = build_layout(scenario, scenario.resume, meshes, device, dtype, evidence, mutation)
                parts = stp.new_step_parts(scenario, layout.model, parts.loss, impl=mutation.optimizer_impl,
                                           scaler=mutation.grad_scaler)
                parts.watch = opt_watch
                if not mutation.skip_checkpoint_load:
                    ckpt.load(layout.model, parts.opt, path)
                    ckpt.load_trainer_state(path, parts.sched, parts.scaler)
                if scenario.tie:
                    evidence.tied[tying.AFTER_RESUME] = tying.tied(layout.model)
            train(layout, range(RESUME_AT, scenario.steps), parts)
        if clock is not None:
            clock.on = False
            gather_routing(record, layout.dp_size, layout.dp_group)
        if layout.sync is not None:  # ddp / replicate (replicate builds its DDP in the first forward)
            evidence.ddp_buckets = par.ddp_buckets(par.ddp_of(layout.runnable, layout.model))
        counter = layout.counter
        if counter is not None:
            evidence.graphs_total = counter.graphs
            if scenario.steps == 1:
                evidence.graphs_after_first_step = counter.graphs
        evidence.graph_breaks = count_graph_breaks() - breaks_before
        if final in ckpt.EXPORTED_LAYOUTS:
            _export(layout.model, record, mutation)
        if scenario.tie:
            evidence.tied[tying.AFTER_LAST_STEP] = tying.tied(layout.model)
        trainable_end = {clean_name(n): 1 for n, p in layout.model.named_parameters() if p.requires_grad}
        evidence.trainable_end = sorted(gathered(trainable_end) if layout.partial_params else trainable_end)
        evidence.frozen_with_grad = sorted(n for n, g in record.grads[-1].items()
                                           if g is not None and is_frozen(n, scenario.train))
        if scenario.eval != "none":
            graphs, calls = (counter.graphs, counter.calls) if counter else (0, 0)
            record.eval_loss, record.eval_logits = stp.evaluate(scenario, layout.runnable, device, parts.loss)
            if counter is not None:
                evidence.eval_graphs, evidence.eval_calls = counter.graphs - graphs, counter.calls - calls
    return record, evidence


def _record_gather_order(model: nn.Module, evidence: Evidence, armed: list[bool]) -> None:
    """Before each block's first forward of the last step (once `armed`): how many FSDP2
    all-gathers that step has issued so far (FSDP2's own pre-forward, prepended, runs first)."""
    from .collectives import FSDP_ALL_GATHER_OPS, calls_of

    for index, block in enumerate(model.layers.children()):
        def before(module: nn.Module, args: Any, index: int = index) -> None:
            if armed[0] and len(evidence.gathers_before_blocks) == index:
                evidence.gathers_before_blocks.append(calls_of(evidence.collectives, FSDP_ALL_GATHER_OPS))

        block.register_forward_pre_hook(before)


def _export(model: nn.Module, record: TrainRecord, mutation: Mutation) -> None:
    """The trained parameters (gathered with full_tensor()) and the full state dict users
    export, kept on the rank that receives the export (checks.export_problems compares them)."""
    trained = {clean_name(n): stp.full_value(p).detach().cpu() for n, p in model.named_parameters()}
    exported = ckpt.full_state_dict(model, local_shards=mutation.export_local_shards)
    if exported:
        record.trained = trained
        record.exported = {clean_name(k): v for k, v in exported.items()}


@contextlib.contextmanager
def _config_for(scenario: Scenario, evidence: Evidence):
    """The scenario's compiler settings (async TP, rowwise casts) plus the inductor probe."""
    if not scenario.uses_inductor:
        yield
        return
    import torch._inductor.config as inductor_config

    patch: dict[str, Any] = {}
    if scenario.async_tp:
        patch["_micro_pipeline_tp"] = True
    if scenario.float8.startswith("rowwise"):
        patch["emulate_precision_casts"] = True  # as torchtitan sets for rowwise Float8
    patch = {k: v for k, v in patch.items() if hasattr(inductor_config, k)}
    with inductor_config.patch(patch), inductor_probe(evidence):
        yield
