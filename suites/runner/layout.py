"""How one phase of a run is laid out: a fresh seed-built model, parallelized as a layout
says (TP/SP, FSDP2, HSDP, EP, PP, or one device), on the meshes that layout needs.

The order is torchtitan's `parallelize_llama`: Float8 conversion, TP (+ async TP), AC,
compile, FSDP2 (parallelize.py holds each step); the Layout record says what the step
loop (training.py) runs and which data slice this rank takes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from . import parallelize as par
from . import step as stp
from . import tying
from .evidence import Evidence, Mutation, gathered, clean_name, placements
from . import checkpoint as ckpt
from .models import Transformer, build_model, is_frozen, rope_cache
from .uneven import uneven_params
from ..scenario.record import (DDP_BUCKET_MB, DDP_LAYOUTS, EP_DEGREE, META_LOAD_LAYOUTS, PP_DEGREE_2D, PP_LAYOUTS, SEED,
                              Scenario)

Meshes = Callable[..., Any]
"""mesh(shape, names) -> DeviceMesh over all ranks (the harness's DistContext.mesh)."""


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
    """A pp row's suites.runner.pipeline.Pipeline (this rank's stages and their schedule)."""
    watch: tuple[int, Counter] | None = None
    """(step, counter): record that step's collectives (forward + backward) into counter."""
    local_group: Any = None
    """The group over which gradient norms of parameters held by some ranks only (EP's
    experts, a pipeline's stages) are summed when clipping (None: every rank)."""
    partial_params: bool = False
    """Each rank holds some parameters only (pp stages, ep_fsdp's experts): every rank's
    gradients are gathered into one table."""
    cp_mesh: Any = None
    """A cp row's mesh: forward and backward run under context_parallel over it."""
    sync: Callable[[bool], Any] | None = None
    """ddp / replicate: sync(last microbatch?) -> the context that skips the gradient
    all-reduce in every microbatch but the last (parallelize.gradient_sync)."""


def freeze(model: nn.Module, train: str) -> None:
    """Freezes what the `train` column freezes (models.is_frozen)."""
    for name, p in model.named_parameters():
        if is_frozen(clean_name(name), train):
            p.requires_grad_(False)


def _make_buffers(model: nn.Module, zeros: bool = False) -> None:
    """The buffers no state dict carries (the rotary cache), made again after to_empty, as
    torchtitan's init_weights makes freqs_cis (`zeros`: left empty, the mutation)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Transformer):
                module.rope.copy_(torch.zeros_like(module.rope) if zeros else rope_cache(module.args))


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def as_meshes(mesh: Any) -> Meshes:
    """A mesh factory from the harness's `dist.mesh`, or from one DeviceMesh (1-D rows)."""
    if callable(mesh) and not hasattr(mesh, "mesh_dim_names"):
        return mesh
    return lambda shape=None, names=None: mesh


def _mesh_for(meshes: Meshes, parallel: str, world_size: int) -> Any:
    if parallel == "pp_fsdp":  # pp outermost, as torchtitan's ParallelDims builds the world mesh
        return meshes((PP_DEGREE_2D, world_size // PP_DEGREE_2D), ("pp", "dp_shard"))
    if parallel == "pp_tp":
        return meshes((PP_DEGREE_2D, world_size // PP_DEGREE_2D), ("pp", "tp"))
    if parallel == "ep_fsdp":  # ep innermost: the ranks of an ep group own different experts
        return meshes((world_size // EP_DEGREE, EP_DEGREE), ("efsdp", "ep"))
    if parallel == "cp":
        return meshes((world_size,), ("cp",))
    if parallel in DDP_LAYOUTS:
        return meshes((world_size,), ("dp_replicate",))
    if parallel == "fsdp_tp":
        return meshes((world_size // 2, 2), ("dp_shard", "tp"))
    if parallel == "hsdp":
        return meshes((2, world_size // 2), ("dp_replicate", "dp_shard"))
    return meshes((world_size,), ("tp",) if parallel in ("tp", "tp_sp") else ("dp_shard",))


def _wrap_ddp(scenario: Scenario, model: nn.Module, mesh: Any, mutation: Mutation) -> nn.Module:
    """Classic DDP as users configure it: static_graph under activation checkpointing (the
    documented pairing), find_unused_parameters where a MoE expert may get no token, the
    row's communication hook (or the mutation's)."""
    hook = mutation.ddp_hook or par.ddp_comm_hook(scenario.ddp_hook)
    return par.apply_ddp(model, mesh, DDP_BUCKET_MB, static_graph=scenario.ac != "none",
                         find_unused_parameters=bool(scenario.model_args.n_experts), hook=hook)


def _build_pipeline(scenario: Scenario, parallel: str, meshes: Meshes, device, dtype: str, evidence: Evidence,
                    mutation: "Mutation") -> Layout:
    """A pp row's stages; pp_fsdp / pp_tp parallelize each stage over the inner mesh dim
    (FSDP2 without resharding after forward, torchtitan's default under PP; or TP with SP),
    and each pp_fsdp data-parallel rank pipelines its own slice of the batch."""
    import torch.distributed as dist

    from . import pipeline

    def fresh() -> nn.Module:
        model = build_model(scenario.model_args, SEED).to(device=device, dtype=torch_dtype(dtype))
        freeze(model, scenario.train)
        return model

    layout = Layout(runnable=None, model=None, partial_params=True)
    group, prepare = None, None
    if parallel != "pp":
        mesh = _mesh_for(meshes, parallel, dist.get_world_size())
        group = mesh["pp"].get_group()
        if parallel == "pp_fsdp":
            inner = mesh["dp_shard"]
            layout.dp_group, layout.dp_rank, layout.dp_size = inner.get_group(), inner.get_local_rank(), inner.size()

            def prepare(m: nn.Module) -> None:
                par.apply_fsdp(m, inner, scenario.mp, reshard=mutation.fsdp_reshard, mode="false",
                               reduce_dtype=mutation.fsdp_reduce_dtype)
        else:
            inner = mesh["tp"]

            def prepare(m: nn.Module) -> None:
                par.apply_tp(m, inner, "tp_sp", scenario.float8, mutation.block_plan_overrides)
    pipe, modules = pipeline.build(scenario.schedule, fresh, stp.build_loss(scenario), scenario.accum, device,
                                   group=group, sum_microbatches=mutation.pp_sum_microbatches, prepare=prepare)
    stages = pipeline.Stages(modules)
    evidence.placements = gathered(placements(stages))
    evidence.trainable = sorted(gathered({clean_name(n): 1 for n, p in stages.named_parameters() if p.requires_grad}))
    layout.runnable = layout.model = stages
    layout.pipe, layout.local_group = pipe, group
    return layout


def build_layout(scenario: Scenario, parallel: str, meshes: Meshes, device, dtype: str, evidence: Evidence,
                 mutation: Mutation) -> Layout:
    """A fresh seed-built model, parallelized as `parallel` (or not at all: `single`)."""
    import torch.distributed as dist

    if parallel in PP_LAYOUTS:
        return _build_pipeline(scenario, parallel, meshes, device, dtype, evidence, mutation)
    meta = scenario.init == "meta_load" and parallel in META_LOAD_LAYOUTS
    if meta:  # fine-tuning's load: parallelized on meta, filled from rank 0's full state dict below
        with torch.device("meta"):
            model = Transformer(scenario.model_args).to(dtype=torch_dtype(dtype))
    else:
        model = build_model(scenario.model_args, SEED).to(device=device, dtype=torch_dtype(dtype))
    freeze(model, scenario.train)
    if scenario.float8 != "none":
        evidence.float8_linears = par.convert_float8(model, scenario.float8, mutation.float8_filter,
                                                     fsdp_float8_all_gather=scenario.fsdp_float8_all_gather)
    layout = Layout(runnable=model, model=model,
                    autocast=parallel in ("single", *DDP_LAYOUTS) and scenario.mp != "none")
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
    if parallel == "hsdp" or parallel in DDP_LAYOUTS:  # data parallel over every rank: each its own slice
        layout.dp_group, layout.dp_rank, layout.dp_size = None, dist.get_rank(), world
    if parallel == "ep":
        layout.ep = par.apply_ep(model, layout.dp_group)
        layout.local_group = layout.dp_group
    if parallel == "cp":
        layout.cp_mesh = mesh
    par.apply_ac(model, scenario.ac)
    if parallel == "replicate":  # torchtitan: compile per block, then replicate; a whole model compiles replicated
        par.apply_replicate(model, mesh, DDP_BUCKET_MB, scenario.compiled,
                            find_unused_parameters=bool(scenario.model_args.n_experts))
    if parallel == "ddp" and scenario.compile != "block":
        layout.runnable = _wrap_ddp(scenario, model, mesh, mutation)
    if scenario.compiled:
        layout.counter = par.CompileCounter(scenario.backend)
        layout.runnable = par.apply_compile(layout.runnable, scenario.compile, layout.counter,
                                            fullgraph=not (scenario.compile == "model"
                                                           and parallel in (*par.FSDP_LAYOUTS, *DDP_LAYOUTS)))
    if parallel == "ddp" and scenario.compile == "block":  # the blocks compiled, then wrapped, as torchtitan orders it
        layout.runnable = _wrap_ddp(scenario, model, mesh, mutation)
    if parallel in DDP_LAYOUTS:
        layout.sync = par.gradient_sync(layout.runnable, model, parallel)
    if parallel in par.FSDP_LAYOUTS:
        par.apply_fsdp(model, dp_mesh, scenario.mp, reshard=mutation.fsdp_reshard, mode=scenario.reshard,
                       offload=scenario.offload, reduce_dtype=mutation.fsdp_reduce_dtype,
                       prefetch="implicit" if mutation.prefetch_ignored else scenario.prefetch)
    if parallel == "ep_fsdp":  # data parallel over every rank; experts' norms summed over their ep group
        every = meshes((world,), ("dp_shard",))
        layout.dp_group, layout.dp_rank, layout.dp_size = every.get_group(), every.get_local_rank(), world
        ep = par.apply_ep_fsdp(model, mesh["ep"], mesh["efsdp"], every, scenario.mp,
                               reduce_dtype=mutation.fsdp_reduce_dtype, divide=not mutation.ep_default_divide)
        layout.local_group, layout.partial_params = ep.group, True
    if meta:
        ckpt.load_pretrained(model, lambda: build_model(scenario.model_args, SEED).to(dtype=torch_dtype(dtype)), device,
                             lambda m: _make_buffers(m, zeros=mutation.meta_load_keeps_buffers))
    if mutation.after_parallelize:
        mutation.after_parallelize(model)
    if model.args.tie:
        evidence.tied[tying.AFTER_PARALLELIZE] = tying.tied(model)
    if scenario.shard == "uneven" and parallel != "single":
        evidence.uneven[parallel] = uneven_params(model)
    gather = gathered if layout.partial_params else (lambda table: table)
    evidence.placements = gather(placements(model))
    evidence.trainable = sorted(gather({clean_name(n): 1 for n, p in model.named_parameters() if p.requires_grad}))
    evidence.float8_all_gather_weights = par.count_float8_all_gather_weights(model) if scenario.float8 != "none" else 0
    return layout
