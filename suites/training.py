"""The parallel run of a scenario, and the evidence of what it did.

It starts from the same seed-built weights as the single-process reference
(suites/reference.py) and sees the same global batches. It applies the scenario
(parallelize.py): data-parallel ranks take their slice of the global batch, split it
into `accum` microbatches and accumulate, so a correct run matches the reference's
full-batch step; the loss, clipping, optimizer and schedule are suites/step.py's, as in
the reference; a `resume` row saves a DCP checkpoint mid-run and goes on under another
layout (checkpoint.py). Each step records the loss and every gradient (DTensor gradients
gathered with full_tensor()), and the run records what the compiler and the step really
did: graphs compiled, graph breaks, recompiles, the post-grad ops inductor emitted, the
ops and the collectives (with their dtypes) the last step executed, the parameters'
placements and which of them require grad.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

from . import checkpoint as ckpt
from . import parallelize as par
from . import step as stp
from .collectives import record_collectives
from .models import ModelArgs, build_model, is_frozen
from .routing import RoutingClock, gather_routing, steer, watch_routing
from .scenarios import BATCH, RESUME_AT, SEED, Scenario

_WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")

Meshes = Callable[..., Any]
"""mesh(shape, names) -> DeviceMesh over all ranks (the harness's DistContext.mesh)."""


@dataclass
class TrainRecord:
    """Per-step losses and gradients (float32, on CPU, full/unsharded); eval results; and,
    for MoE runs, tokens per expert per (step, block, microbatch): `expert_tokens` lists
    the counts, `routing` keys them by (step, block, global microbatch index) so the
    parallel run's routing can be compared with the reference's (eager runs only)."""

    losses: list[float] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor | None]] = field(default_factory=list)
    eval_loss: float | None = None
    eval_logits: torch.Tensor | None = None
    expert_tokens: list[list[int]] = field(default_factory=list)
    routing: dict[tuple[int, int, int], tuple[int, ...]] = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)
    """The total gradient norm clipping measured, per step (clipped rows only)."""


@dataclass
class Evidence:
    """What the parallel run's compiler, kernels and collectives did; judged by checks.check_graph."""

    compiled: bool = False
    graphs_after_first_step: int = 0
    graphs_total: int = 0
    graph_breaks: int = 0
    graph_calls: list[int] = field(default_factory=list)
    """Compiled-graph calls (forward) per training step: 0 is a step that ran eager."""
    eval_graphs: int = 0
    eval_calls: int = 0
    post_grad_graphs: int = 0
    post_grad_ops: Counter = field(default_factory=Counter)
    runtime_ops: Counter = field(default_factory=Counter)
    float8_linears: int = 0
    float8_all_gather_weights: int = 0
    placements: dict[str, str] = field(default_factory=dict)
    trainable: list[str] | None = None
    """Parameters that require grad once the model is parallelized and compiled (None:
    not recorded, as in evidence built by hand)."""
    trainable_end: list[str] | None = None
    """... and after the last step (nothing in training may flip requires_grad)."""
    frozen_with_grad: list[str] = field(default_factory=list)
    collectives: Counter = field(default_factory=Counter)
    """(op, dtype) -> calls of every c10d / functional collective in the last step."""

    @property
    def recompiles(self) -> int:
        return self.graphs_total - self.graphs_after_first_step


@dataclass
class Mutation:
    """Ways to break a run on purpose, for the tests that prove the checks bite.

    Real scenarios never set these; tests/test_suite_mutations.py does.
    """

    block_plan_overrides: dict[str, Any] | None = None
    float8_filter: Callable[[nn.Module, str], bool] | None = None
    after_parallelize: Callable[[nn.Module], None] | None = None
    fsdp_reshard: bool = True
    dynamo_config: dict[str, Any] | None = None
    skip_checkpoint_load: bool = False
    fsdp_reduce_dtype: torch.dtype | None = None
    """FSDP2 reduces gradients in this dtype, whatever the MixedPrecisionPolicy says."""
    clip_local_norm: bool = False
    """Clipping measures each rank's local shards' norm, never reduced over the ranks."""
    pp_sum_microbatches: bool = False
    """The pipeline schedule sums its microbatches' gradients instead of averaging them."""


def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def batches(scenario: Scenario, seed: int = SEED) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batch of every step: BATCH rows per data-parallel rank and microbatch.

    From a private generator (identical on every rank). A TP-only row with one
    microbatch draws exactly what the table's first rows always drew.
    """
    args = scenario.model_args
    rows = BATCH * scenario.data_parallel_max * scenario.accum
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for step in range(scenario.steps):
        shape = (rows, scenario.seq_len(step))
        tokens = torch.randint(0, args.vocab_size, shape, generator=gen)
        labels = torch.randint(0, args.vocab_size, shape, generator=gen)
        out.append((tokens, labels))
    return out


def eval_batch(args: ModelArgs, seed: int = SEED) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 2)
    return torch.randint(0, args.vocab_size, (BATCH, args.max_seq_len), generator=gen)


def freeze(model: nn.Module, train: str) -> None:
    """Freezes what the `train` column freezes (models.is_frozen)."""
    for name, p in model.named_parameters():
        if is_frozen(clean_name(name), train):
            p.requires_grad_(False)


def full_grads(model: nn.Module, ep: par.ExpertParallel | None = None) -> dict[str, torch.Tensor | None]:
    """Every parameter's gradient as a full float32 CPU tensor (collective for DTensors;
    under expert parallel, each expert's gradient comes from the rank that owns it)."""
    out: dict[str, torch.Tensor | None] = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[clean_name(name)] = None if g is None else g.detach().float().cpu().clone()
    if ep is not None:
        _gather_expert_grads(model, ep, out)
    return out


def _gather_expert_grads(model: nn.Module, ep: par.ExpertParallel, out: dict) -> None:
    import torch.distributed as dist

    for name, p in model.named_parameters():
        key = clean_name(name)
        if ".experts." not in key:
            continue
        expert = int(key.split(".experts.")[1].split(".")[0])
        owner = expert // ep.local
        g = p.grad.detach().clone() if ep.owns(expert) and p.grad is not None else torch.zeros_like(p)
        dist.broadcast(g, src=dist.get_global_rank(ep.group, owner) if ep.group is not None else owner, group=ep.group)
        out[key] = g.float().cpu()


def placement_name(placement: Any) -> str:
    """S<dim>, R or P: a spelling that does not change with torch's placement reprs."""
    if placement.is_shard() or type(placement).__name__ == "_StridedShard":  # FSDP2 over TP: strided
        return f"S{placement.dim}"
    if placement.is_replicate():
        return "R"
    return "P"


def placements(model: nn.Module) -> dict[str, str]:
    """Each parameter's DTensor placements (`local` for a plain tensor)."""
    out = {}
    for name, p in model.named_parameters():
        pl = getattr(p, "placements", None)
        out[clean_name(name)] = "local" if pl is None else ",".join(placement_name(x) for x in pl)
    return out


def _value(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _loss_context(scenario: Scenario):
    if not scenario.loss_parallel:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


@dataclass
class Layout:
    """How one phase of a run is parallelized: the module it runs, its data slice."""

    runnable: nn.Module
    model: nn.Module
    dp_rank: int = 0
    dp_size: int = 1
    dp_group: Any = None
    ep: par.ExpertParallel | None = None
    counter: par.CompileCounter | None = None
    autocast: bool = False
    """bf16 autocast around forward and loss: mixed precision on one device (no FSDP2)."""
    pipe: Any = None
    """A pp row's suites.pipeline.Pipeline (this rank's stages and their schedule)."""
    watch: tuple[int, Counter] | None = None
    """(step, counter): record that step's collectives (forward + backward) into counter."""


@dataclass
class Step:
    """What every step of a run shares: the loss, the optimizer and its schedule."""

    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    opt: torch.optim.Optimizer
    sched: Any = None


def _new_step(scenario: Scenario, model: nn.Module, loss: Callable | None = None) -> Step:
    opt, sched = stp.make_optimizer(((clean_name(n), p) for n, p in model.named_parameters()), scenario)
    return Step(loss or stp.build_loss(scenario), opt, sched)


def _clip(scenario: Scenario, layout: Layout, record: TrainRecord, mutation: "Mutation") -> None:
    """Clips as the row says; under EP the experts' gradients live on their owners only."""
    if scenario.clip == "none":
        return
    params = [p for p in layout.model.parameters() if p.requires_grad]
    local = [p for n, p in layout.model.named_parameters() if ".experts." in n] if layout.ep else []
    if layout.pipe is not None:
        local = params  # every gradient lives on the rank of its stage only
    norm = stp.clip_grads(params, scenario.clip, local_params=local, group=layout.dp_group,
                          local_norm=mutation.clip_local_norm)
    record.grad_norms.append(float(norm.cpu()))


def _finish_step(step: Step) -> None:
    step.opt.step()
    if step.sched is not None:
        step.sched.step()


def _train_steps(scenario: Scenario, layout: Layout, data, steps: range, device, record: TrainRecord,
                 step_parts: Step, mutation: "Mutation", on_step: Callable[[int], Any] | None = None,
                 clock: RoutingClock | None = None) -> None:
    """Steps of data-parallel, accumulated training; records the global loss and full grads."""
    import torch.distributed as dist

    for step in steps:
        tokens, labels = data[step]
        if layout.pipe is not None:
            _pipeline_step(scenario, layout, tokens, labels, device, record, step_parts, mutation,
                           on_step(step) if on_step else contextlib.nullcontext())
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
                with _loss_context(scenario), \
                        record_collectives(layout.watch[1]) if watched else contextlib.nullcontext():
                    with _autocast(layout, device):
                        loss = step_parts.loss(layout.runnable(tokens[start:start + mb].to(device)),
                                               labels[start:start + mb].to(device)) / scenario.accum
                    loss.backward()
                total += _value(loss).detach().float()
            if layout.dp_size > 1:
                dist.all_reduce(total, group=layout.dp_group)
                total /= layout.dp_size
            if layout.ep is not None:
                _average_ep_grads(layout.model, layout.dp_group, layout.dp_size)
        _clip(scenario, layout, record, mutation)
        record.losses.append(float(total.cpu()))
        record.grads.append(full_grads(layout.model, layout.ep))
        _finish_step(step_parts)
        if scenario.fsdp_float8_all_gather:
            par.precompute_float8_scales(layout.model)


def _autocast(layout: Layout, device):
    if not layout.autocast:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def _pipeline_step(scenario: Scenario, layout: Layout, tokens, labels, device, record: TrainRecord,
                   step_parts: Step, mutation: "Mutation", ctx: Any) -> None:
    """One step of a pp row: the schedule runs every microbatch through the stages."""
    from . import pipeline

    with ctx:
        step_parts.opt.zero_grad(set_to_none=scenario.zero_grad == "none")
        total = pipeline.step(layout.pipe, tokens.to(device), labels.to(device))
    _clip(scenario, layout, record, mutation)
    record.losses.append(float(total.cpu()))
    record.grads.append(_gathered(full_grads(layout.model)))
    _finish_step(step_parts)


def _gathered(table: dict) -> dict:
    """Every rank's entries in one dict (a pp rank holds its stages' parameters only)."""
    import torch.distributed as dist

    tables: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(tables, table)
    out: dict = {}
    for t in tables:
        out.update({k: v for k, v in t.items() if v is not None or k not in out})
    return dict(sorted(out.items()))


def _build_pipeline(scenario: Scenario, device, dtype: str, evidence: Evidence, mutation: "Mutation") -> Layout:
    from . import pipeline

    def fresh() -> nn.Module:
        model = build_model(scenario.model_args, SEED).to(device=device, dtype=_dtype(dtype))
        freeze(model, scenario.train)
        return model

    pipe, modules = pipeline.build(scenario.schedule, fresh, stp.build_loss(scenario), scenario.accum, device,
                                   sum_microbatches=mutation.pp_sum_microbatches)
    stages = pipeline.Stages(modules)
    evidence.placements = _gathered(placements(stages))
    evidence.trainable = sorted(_gathered({clean_name(n): 1 for n, p in stages.named_parameters() if p.requires_grad}))
    return Layout(runnable=stages, model=stages, pipe=pipe)


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


def _eval(scenario: Scenario, runnable: nn.Module, device, loss: Callable) -> tuple[float, torch.Tensor]:
    mode = torch.inference_mode() if scenario.eval == "inference" else torch.no_grad()
    tokens = eval_batch(scenario.model_args)
    gen = torch.Generator().manual_seed(SEED + 3)
    labels = torch.randint(0, scenario.model_args.vocab_size, tokens.shape, generator=gen)
    with mode, _loss_context(scenario):
        logits = runnable(tokens.to(device))
        value = loss(logits, labels.to(device))
        return float(_value(value).float().cpu()), _value(logits).float().cpu().clone()


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


@contextlib.contextmanager
def count_executed_ops(into: Counter):
    """Counts the ops a block of code executes, by the profiler's names (aten::mm ...).

    Ops called inside tensor-subclass dispatch (DTensor, Float8) and the extern kernels
    of compiled graphs are recorded too, which a TorchDispatchMode would not see.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield
    for event in prof.events():
        into[event.name] += 1


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _as_meshes(mesh: Any) -> Meshes:
    """A mesh factory from the harness's `dist.mesh`, or from one DeviceMesh (1-D rows)."""
    if callable(mesh) and not hasattr(mesh, "mesh_dim_names"):
        return mesh
    return lambda shape=None, names=None: mesh


def _mesh_for(meshes: Meshes, parallel: str, world_size: int) -> Any:
    if parallel == "fsdp_tp":
        return meshes((world_size // 2, 2), ("dp_shard", "tp"))
    if parallel == "hsdp":
        return meshes((2, world_size // 2), ("dp_replicate", "dp_shard"))
    return meshes((world_size,), ("tp",) if parallel in ("tp", "tp_sp") else ("dp_shard",))


def build_layout(scenario: Scenario, parallel: str, meshes: Meshes, device, dtype: str, evidence: Evidence,
                 mutation: Mutation) -> Layout:
    """A fresh seed-built model, parallelized as `parallel` (or not at all: `single`)."""
    import torch.distributed as dist

    if parallel == "pp":
        return _build_pipeline(scenario, device, dtype, evidence, mutation)
    model = build_model(scenario.model_args, SEED).to(device=device, dtype=_dtype(dtype))
    freeze(model, scenario.train)
    if scenario.float8 != "none":
        evidence.float8_linears = par.convert_float8(model, scenario.float8, mutation.float8_filter,
                                                     fsdp_float8_all_gather=scenario.fsdp_float8_all_gather)
    layout = Layout(runnable=model, model=model, autocast=parallel == "single" and scenario.mp == "bf16")
    mesh = tp_mesh = dp_mesh = None
    world = 1
    if parallel != "single":  # one device (single rows, a resume row's last layout): no mesh, AC/compile below
        world = dist.get_world_size()
        mesh = _mesh_for(meshes, parallel, world)
        tp_mesh = mesh["tp"] if parallel == "fsdp_tp" else mesh
        dp_mesh = mesh["dp_shard"] if parallel == "fsdp_tp" else mesh
    if parallel in ("tp", "tp_sp", "fsdp_tp"):
        plan = "tp_sp" if parallel == "fsdp_tp" else parallel
        par.apply_tp(model, tp_mesh, plan, scenario.float8, mutation.block_plan_overrides,
                     loss_parallel=scenario.loss_parallel)
        if scenario.async_tp:
            par.enable_async_tp(tp_mesh)
    if parallel in ("fsdp", "fsdp_tp", "ep"):
        layout.dp_group = dp_mesh.get_group()
        layout.dp_rank = dp_mesh.get_local_rank()
        layout.dp_size = dp_mesh.size()
    if parallel == "hsdp":  # data parallel over both mesh dims: every rank its own slice
        layout.dp_group, layout.dp_rank, layout.dp_size = None, dist.get_rank(), world
    if parallel == "ep":
        layout.ep = par.apply_ep(model, layout.dp_group)
    par.apply_ac(model, scenario.ac)
    if scenario.compiled:
        layout.counter = par.CompileCounter(scenario.backend)
        layout.runnable = par.apply_compile(model, scenario.compile, layout.counter,
                                            fullgraph=not (scenario.compile == "model" and parallel in par.FSDP_LAYOUTS))
    if parallel in par.FSDP_LAYOUTS:
        par.apply_fsdp(model, dp_mesh, scenario.mp, reshard=mutation.fsdp_reshard, mode=scenario.reshard,
                       offload=scenario.offload, reduce_dtype=mutation.fsdp_reduce_dtype)
    if mutation.after_parallelize:
        mutation.after_parallelize(model)
    evidence.placements = placements(model)
    evidence.trainable = sorted(clean_name(n) for n, p in model.named_parameters() if p.requires_grad)
    evidence.float8_all_gather_weights = par.count_float8_all_gather_weights(model) if scenario.float8 != "none" else 0
    return layout


def run_parallel(scenario: Scenario, mesh: Any, device: torch.device, dtype: str,
                 mutation: Mutation | None = None) -> tuple[TrainRecord, Evidence]:
    """The scenario's parallel run, with the evidence of what compiled and what executed.

    `mesh`: the harness's `dist.mesh` (a factory: 2-D rows and resume rows need other
    meshes than the 1-D one) or, for 1-D rows, a DeviceMesh.
    """
    mutation = mutation or Mutation()
    meshes = _as_meshes(mesh)
    evidence = Evidence(compiled=scenario.compiled)
    dtype = scenario.train_dtype_override or dtype
    record = TrainRecord()
    data = batches(scenario)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_config_for(scenario, evidence))
        if mutation.dynamo_config:
            import torch._dynamo.config as dynamo_config

            stack.enter_context(dynamo_config.patch(mutation.dynamo_config))
        layout = build_layout(scenario, scenario.parallel, meshes, device, dtype, evidence, mutation)
        breaks_before = _graph_breaks()
        last = scenario.steps - 1

        final = scenario.parallel if scenario.resume == "none" else scenario.resume
        watch = (last, evidence.collectives) if final in par.FSDP_LAYOUTS and not scenario.fsdp_float8_all_gather \
            else None  # FSDP2's collective dtypes, judged by checks.py

        @contextlib.contextmanager
        def last_step():
            with count_executed_ops(evidence.runtime_ops):
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

        def train(layout: Layout, steps: range, parts: Step) -> None:
            layout.watch = watch
            for step in steps:
                _train_steps(scenario, layout, data, range(step, step + 1), device, record, parts, mutation,
                             on_step, clock)
                if layout.counter is not None:
                    evidence.graph_calls[-1] += layout.counter.calls

        parts = _new_step(scenario, layout.model)
        if scenario.resume == "none":
            train(layout, range(scenario.steps), parts)
        else:
            train(layout, range(RESUME_AT), parts)
            with ckpt.shared_dir() as path:
                ckpt.save(layout.model, parts.opt, path, asynchronous=scenario.dcp == "async")
                layout = build_layout(scenario, scenario.resume, meshes, device, dtype, evidence, mutation)
                parts = _new_step(scenario, layout.model, parts.loss)
                if not mutation.skip_checkpoint_load:
                    ckpt.load(layout.model, parts.opt, path)
            train(layout, range(RESUME_AT, scenario.steps), parts)
        if clock is not None:
            clock.on = False
            gather_routing(record, layout.dp_size, layout.dp_group)
        counter = layout.counter
        if counter is not None:
            evidence.graphs_total = counter.graphs
            if scenario.steps == 1:
                evidence.graphs_after_first_step = counter.graphs
        evidence.graph_breaks = _graph_breaks() - breaks_before
        trainable_end = {clean_name(n): 1 for n, p in layout.model.named_parameters() if p.requires_grad}
        evidence.trainable_end = sorted(_gathered(trainable_end) if layout.pipe is not None else trainable_end)
        evidence.frozen_with_grad = sorted(n for n, g in record.grads[-1].items()
                                           if g is not None and is_frozen(n, scenario.train))
        if scenario.eval != "none":
            graphs, calls = (counter.graphs, counter.calls) if counter else (0, 0)
            record.eval_loss, record.eval_logits = _eval(scenario, layout.runnable, device, parts.loss)
            if counter is not None:
                evidence.eval_graphs, evidence.eval_calls = counter.graphs - graphs, counter.calls - calls
    return record, evidence


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


@contextlib.contextmanager
def inductor_probe(evidence: Evidence):
    """Records the post-grad ops of every graph inductor compiles inside the block.

    Inductor's caches are turned off so the pass sees every graph: a cache hit skips the
    passes, and the fused async-TP ops would look absent.
    """
    import torch._inductor.config as inductor_config

    counter = par.PostGradOpCounter()
    patch = {"post_grad_custom_post_pass": counter, "fx_graph_cache": False}
    with contextlib.ExitStack() as stack:
        stack.enter_context(inductor_config.patch({k: v for k, v in patch.items() if hasattr(inductor_config, k)}))
        try:
            import torch._functorch.config as functorch_config
        except ImportError:
            functorch_config = None
        if functorch_config is not None and hasattr(functorch_config, "enable_autograd_cache"):
            stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
        try:
            yield
        finally:
            evidence.post_grad_graphs = counter.graphs
            evidence.post_grad_ops = counter.ops
