"""One runner for every scenario: train the parallel model and its single-process reference.

Both start from the same seed-built weights and see the same global batches. The
reference is the unsharded model in eager mode with no AC (with the scenario's Float8
recipe when it has one: Float8 is judged against Float8, as torchao does), one step per
global batch. A mixed-precision row's reference computes as FSDP2's bf16 policy does
(bf16 compute per rank and microbatch, float32 reduction), so bf16 routing is judged by bf16 routing. The parallel run applies the scenario (parallelize.py): data-parallel
ranks take their slice of the global batch, split it into `accum` microbatches and
accumulate, so a correct run matches the reference's full-batch step; a `resume` row
saves a DCP checkpoint mid-run and goes on under another layout (checkpoint.py). Each step records the loss and every gradient (DTensor
gradients gathered with full_tensor()), and the TP run also records what the compiler
and the step really did: graphs compiled, graph breaks, recompiles, the post-grad ops
inductor emitted, the ops the last step executed, and the parameters' placements.
"""

from __future__ import annotations

import contextlib
import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import checkpoint as ckpt
from . import parallelize as par
from .models import ModelArgs, build_model, frozen_by_default
from .scenarios import BATCH, LR, RESUME_AT, SEED, Scenario

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


@dataclass
class RoutingClock:
    """Where a routing hook is: the step, the global index of the microbatch it sees
    first, and into how many microbatches its input splits."""

    step: int = 0
    chunk: int = 0
    parts: int = 1
    on: bool = True
    """Off for the eval forward: only training steps are compared."""


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
    trainable: list[str] = field(default_factory=list)
    frozen_with_grad: list[str] = field(default_factory=list)

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


def make_optimizer(params, optim: str) -> torch.optim.Optimizer:
    """SGD or AdamW over the trainable parameters, DTensor and plain ones in separate groups.

    The `tp` plan leaves the norms' weights plain tensors beside DTensor linears; the
    foreach kernels (the default on CUDA) cannot mix the two in one group. Grouping does
    not change the arithmetic, so the single-group reference stays comparable.
    """
    params = [p for p in params if p.requires_grad]
    groups = [g for g in ([p for p in params if hasattr(p, "placements")],
                          [p for p in params if not hasattr(p, "placements")]) if g]
    param_groups = [{"params": g} for g in groups]
    if optim == "sgd":
        return torch.optim.SGD(param_groups, lr=LR["sgd"])
    return torch.optim.AdamW(param_groups, lr=LR["adamw"], weight_decay=0.01)


def freeze(model: nn.Module) -> None:
    """The `frozen` rows: only the LoRA adapters train (embeddings, norms, linears frozen)."""
    for name, p in model.named_parameters():
        if frozen_by_default(clean_name(name)):
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


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


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


def _train_steps(scenario: Scenario, layout: Layout, data, steps: range, device, record: TrainRecord,
                 opt: torch.optim.Optimizer, on_step: Callable[[int], Any] | None = None,
                 clock: RoutingClock | None = None) -> None:
    """Steps of data-parallel, accumulated training; records the global loss and full grads."""
    import torch.distributed as dist

    for step in steps:
        tokens, labels = data[step]
        mb = tokens.shape[0] // (layout.dp_size * scenario.accum)  # rows per microbatch
        ctx = on_step(step) if on_step else contextlib.nullcontext()
        with ctx:
            opt.zero_grad(set_to_none=True)
            total = torch.zeros((), dtype=torch.float32, device=device)
            for micro in range(scenario.accum):
                start = (layout.dp_rank * scenario.accum + micro) * mb
                if clock is not None:
                    clock.step, clock.chunk = step, layout.dp_rank * scenario.accum + micro
                with _loss_context(scenario):
                    with _autocast(layout, device):
                        loss = _loss(layout.runnable(tokens[start:start + mb].to(device)),
                                     labels[start:start + mb].to(device)) / scenario.accum
                    loss.backward()
                total += _value(loss).detach().float()
            if layout.dp_size > 1:
                dist.all_reduce(total, group=layout.dp_group)
                total /= layout.dp_size
            if layout.ep is not None:
                _average_ep_grads(layout.model, layout.dp_group, layout.dp_size)
        record.losses.append(float(total.cpu()))
        record.grads.append(full_grads(layout.model, layout.ep))
        opt.step()
        if scenario.fsdp_float8_all_gather:
            par.precompute_float8_scales(layout.model)


def _autocast(layout: Layout, device):
    if not layout.autocast:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


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


def _eval(scenario: Scenario, runnable: nn.Module, device) -> tuple[float, torch.Tensor]:
    mode = torch.inference_mode() if scenario.eval == "inference" else torch.no_grad()
    tokens = eval_batch(scenario.model_args)
    gen = torch.Generator().manual_seed(SEED + 3)
    labels = torch.randint(0, scenario.model_args.vocab_size, tokens.shape, generator=gen)
    with mode, _loss_context(scenario):
        logits = runnable(tokens.to(device))
        loss = _loss(logits, labels.to(device))
        return float(_value(loss).float().cpu()), _value(logits).float().cpu().clone()


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


def _routing_hook(record: TrainRecord, block: int, clock: RoutingClock):
    """Counts tokens per expert in every microbatch the MoE block sees (eager)."""
    def hook(module, inputs) -> None:
        if not clock.on:
            return
        with torch.no_grad():
            for i, part in enumerate(_value(inputs[0]).chunk(clock.parts, dim=0)):
                _, chosen = module.route(part.reshape(-1, part.shape[-1]))
                counts = torch.bincount(_value(chosen).flatten().cpu(), minlength=len(module.experts)).tolist()
                record.expert_tokens.append(counts)
                record.routing[(clock.step, block, clock.chunk + i)] = tuple(counts)
    return hook


def _watch_routing(model: nn.Module, record: TrainRecord, clock: RoutingClock) -> None:
    for block, layer in enumerate(model.layers.values()):
        layer.feed_forward.register_forward_pre_hook(_routing_hook(record, block, clock))


def _gather_routing(record: TrainRecord, layout: Layout) -> None:
    """Every data-parallel rank's routing into one table (each rank saw its own microbatches)."""
    import torch.distributed as dist

    if layout.dp_size == 1:
        return
    tables: list[Any] = [None] * layout.dp_size
    dist.all_gather_object(tables, record.routing, group=layout.dp_group)
    for table in tables:
        record.routing.update(table)


def run_reference(scenario: Scenario, device: torch.device, dtype: str) -> TrainRecord:
    """The unsharded model on one process, eager, no AC; Float8 only when the scenario has it."""
    args = scenario.model_args
    model = build_model(args, SEED).to(device=device, dtype=_dtype(scenario.train_dtype_override or dtype))
    if scenario.train == "frozen":
        freeze(model)
    if scenario.float8 != "none":
        par.convert_float8(model, scenario.float8)
    record = TrainRecord()
    clock = RoutingClock(parts=scenario.dp_degree * scenario.accum)
    if args.n_experts and scenario.mp == "none":
        _watch_routing(model, record, clock)
    data = batches(scenario)
    opt = make_optimizer(model.parameters(), scenario.optim)
    for clock.step, (tokens, labels) in enumerate(data):
        opt.zero_grad(set_to_none=True)
        if scenario.mp == "bf16":
            loss = _mixed_precision_grads(scenario, model, tokens, labels, device, record, clock)
        else:
            loss = _loss(model(tokens.to(device)), labels.to(device))
            loss.backward()
        record.losses.append(float(loss.detach().float().cpu()))
        record.grads.append(full_grads(model))
        opt.step()
    if scenario.eval != "none":
        clock.on = False
        record.eval_loss, record.eval_logits = _eval(scenario, model, device)
    return record


def _mixed_precision_grads(scenario: Scenario, model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor,
                           device, record: TrainRecord, clock: RoutingClock) -> torch.Tensor:
    """FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on one process.

    A float32 reference cannot judge a bf16 run of a router: a token whose top-k scores
    lie within bf16 rounding picks another expert, and that expert's gradient differs
    wholly. So, as FSDP2 does, each data-parallel rank's microbatch runs on a bf16 cast
    of the float32 parameters (buffers stay float32), its bf16 gradients are cast to
    float32, summed over microbatches and averaged over ranks into the float32 master's
    `.grad`. Returns the global loss (the mean over ranks of the accumulated loss).
    """
    shadow = copy.deepcopy(model)
    for p in shadow.parameters():
        p.data = p.data.to(torch.bfloat16)
    shadow_clock = RoutingClock(step=clock.step)
    if scenario.model_args.n_experts:
        _watch_routing(shadow, record, shadow_clock)
    ranks, accum = scenario.dp_degree, scenario.accum
    rows = tokens.shape[0] // (ranks * accum)
    grads: dict[str, torch.Tensor] = {}
    total = torch.zeros((), dtype=torch.float32)
    for chunk in range(ranks * accum):
        shadow_clock.chunk = chunk
        shadow.zero_grad(set_to_none=True)
        part = slice(chunk * rows, (chunk + 1) * rows)
        loss = _loss(shadow(tokens[part].to(device)), labels[part].to(device)) / accum
        loss.backward()
        total += loss.detach().float().cpu() / ranks
        for name, p in shadow.named_parameters():
            if p.grad is not None:
                g = p.grad.float() / ranks
                grads[name] = grads[name] + g if name in grads else g
    for name, p in model.named_parameters():
        p.grad = grads.get(name)
    return total


def _as_meshes(mesh: Any) -> Meshes:
    """A mesh factory from the harness's `dist.mesh`, or from one DeviceMesh (1-D rows)."""
    if callable(mesh) and not hasattr(mesh, "mesh_dim_names"):
        return mesh
    return lambda shape=None, names=None: mesh


def _mesh_for(meshes: Meshes, parallel: str, world_size: int) -> Any:
    if parallel == "fsdp_tp":
        return meshes((world_size // 2, 2), ("dp_shard", "tp"))
    return meshes((world_size,), ("tp",) if parallel in ("tp", "tp_sp") else ("dp_shard",))


def build_layout(scenario: Scenario, parallel: str, meshes: Meshes, device, dtype: str, evidence: Evidence,
                 mutation: Mutation) -> Layout:
    """A fresh seed-built model, parallelized as `parallel` (or not at all: `single`)."""
    import torch.distributed as dist

    model = build_model(scenario.model_args, SEED).to(device=device, dtype=_dtype(dtype))
    if scenario.train == "frozen":
        freeze(model)
    if scenario.float8 != "none":
        evidence.float8_linears = par.convert_float8(model, scenario.float8, mutation.float8_filter,
                                                     fsdp_float8_all_gather=scenario.fsdp_float8_all_gather)
    layout = Layout(runnable=model, model=model, autocast=parallel == "single" and scenario.mp == "bf16")
    mesh = tp_mesh = dp_mesh = None
    if parallel != "single":  # one device (single rows, a resume row's last layout): no mesh, AC/compile below
        mesh = _mesh_for(meshes, parallel, dist.get_world_size())
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
    if parallel == "ep":
        layout.ep = par.apply_ep(model, layout.dp_group)
    par.apply_ac(model, scenario.ac)
    if scenario.compiled:
        layout.counter = par.CompileCounter(scenario.backend)
        layout.runnable = par.apply_compile(model, scenario.compile, layout.counter,
                                            fullgraph=not (scenario.compile == "model" and parallel in par.FSDP_LAYOUTS))
    if parallel in par.FSDP_LAYOUTS:
        par.apply_fsdp(model, dp_mesh, scenario.mp, reshard=mutation.fsdp_reshard)
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

        def on_step(step: int):
            counter = layout.counter
            if step == 1 and counter is not None:
                evidence.graphs_after_first_step = counter.graphs
            if counter is not None:
                evidence.graph_calls.append(-counter.calls)
            if step == last:
                return count_executed_ops(evidence.runtime_ops)
            return contextlib.nullcontext()

        clock = None
        if scenario.model_args.n_experts and not scenario.compiled and scenario.resume == "none":
            clock = RoutingClock()  # the routing of an eager MoE run is compared with the reference's
            _watch_routing(layout.model, record, clock)

        def train(layout: Layout, steps: range, opt) -> None:
            for step in steps:
                _train_steps(scenario, layout, data, range(step, step + 1), device, record, opt, on_step, clock)
                if layout.counter is not None:
                    evidence.graph_calls[-1] += layout.counter.calls

        opt = make_optimizer(layout.model.parameters(), scenario.optim)
        if scenario.resume == "none":
            train(layout, range(scenario.steps), opt)
        else:
            train(layout, range(RESUME_AT), opt)
            with ckpt.shared_dir() as path:
                ckpt.save(layout.model, opt, path)
                layout = build_layout(scenario, scenario.resume, meshes, device, dtype, evidence, mutation)
                opt = make_optimizer(layout.model.parameters(), scenario.optim)
                if not mutation.skip_checkpoint_load:
                    ckpt.load(layout.model, opt, path)
            train(layout, range(RESUME_AT, scenario.steps), opt)
        if clock is not None:
            clock.on = False
            _gather_routing(record, layout)
        counter = layout.counter
        if counter is not None:
            evidence.graphs_total = counter.graphs
            if scenario.steps == 1:
                evidence.graphs_after_first_step = counter.graphs
        evidence.graph_breaks = _graph_breaks() - breaks_before
        evidence.frozen_with_grad = sorted(n for n, g in record.grads[-1].items()
                                           if g is not None and scenario.train == "frozen" and frozen_by_default(n))
        if scenario.eval != "none":
            graphs, calls = (counter.graphs, counter.calls) if counter else (0, 0)
            record.eval_loss, record.eval_logits = _eval(scenario, layout.runnable, device)
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
