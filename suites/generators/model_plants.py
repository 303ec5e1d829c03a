"""Bugs planted on purpose in the models generator's parallel run, for the tests that prove
it finds and shrinks them (tests/test_fuzz_models.py). A real run never sets the variable.

None is shaped like a table column: each needs a structure feature AND a layout, and is
quiet (training completes, nothing raises), the way such bugs sit upstream:
  - buffer_drift: a buffer not kept in sync across ranks (rank 1 rebuilds its rope cache /
    scale with another constant after parallelize). DDP broadcasts buffers from rank 0 at
    every forward and hides it; FSDP2 and TP keep each rank's own: found under those.
  - tied_grad_once: under FSDP2, the tied weight's gradient counts only the embedding's use
    (the head's contribution dropped, as a unit that registers the shared parameter once
    and reduces one use): found only where tie and fsdp meet.
  - idle_expert_stale: an expert that got no token on a rank does not stay without a
    gradient: it re-adds the last gradient it had there (a stale per-expert buffer, as a
    grouped-GEMM fallback that reuses its last output): needs experts, and a step or
    microbatch after the expert ran, on a rank where it then got none.
  - frozen_grad: under FSDP2, a frozen parameter comes out of backward with a zero
    gradient (as flat-parameter sharding that reduces frozen and trainable parameters
    together materializes one): training numbers stay right; requires_grad does not
    survive. Needs frozen parameters and an FSDP2 layout (fsdp, hsdp).
  - recompute_drift: under FSDP2, a checkpointed block's recomputation gives its first
    projection's output a relative 1e-3 off the forward's (as a recompute that reads
    state the forward changed): the forward is right, the gradients are not. Needs ac.
  - balance_local_counts: the load-balancing bias is updated from the rank's own token
    counts (the all-reduce over the data-parallel ranks forgotten): ranks route
    differently from the step after. Needs balance, a data-parallel layout and a step
    after the first update.
  - dp_first_axis: the balancing counts are summed over the mesh's first axis only, as code
    that takes `mesh.get_group(0)` for "the" data-parallel group: right on a 1-D mesh, wrong
    where HSDP's mesh puts a size-1 dp_replicate axis first (fsdp built with mesh=singleton,
    what a trainer that always builds HSDP's mesh gives with dp_replicate=1). Under
    parallel=fsdp it needs that form, balance and a step after the first update.
  - sp_norm_grad_local: a SequenceParallel norm computes with its weight as a local
    tensor (`weight.to_local()`, whose gradient is taken as already Replicate), so the
    weight's gradient is each rank's own sequence shard's share, never summed over tp:
    the bug Megatron guards against with `allreduce_sequence_parallel_gradients` and
    hand-written SP norms forget. Forward numbers stay right; needs a plan with
    sequence parallel (plan=titan) on a TP layout.
  - pp_tied_unsummed: under a pipeline, the tied embedding's and head's copies (first and
    last stage) each keep their own gradient: the sum over the pipeline that Megatron-LM's
    embedding group does is forgotten; the two copies then drift apart. Needs tie and pp.
  - pp_stage_unscaled: under Interleaved1F1B, the last stage skips `scale_grads`, so its
    gradients are the microbatches' sum where every other stage's are their mean (a
    schedule that forgets one stage's REDUCE_GRAD). Needs pp, that schedule, and a mean
    loss over more than one microbatch.
  - pp_tp_tied_world: under PP x TP, the tied copies' gradients are summed over every rank
    instead of the pipeline's ("pp") group: an embedding group built over the whole world
    (Megatron-LM builds its embedding group from the first and last pipeline ranks of each
    TP/DP index). Whole copies (plan=megatron) count each tp index's gradient twice, vocab
    shards (plan=titan) add another index's rows. Needs tie and pp_tp.
  - root_param_unreduced: under FSDP2, a vision transformer's root-level bare parameters
    (the class token and position embedding, which no submodule's forward reads) reach the
    gradient reduction with rank 0's contribution only: every other rank's share arrives as
    zeros (as a root unit that hooks its submodules' parameters and zero-fills the rest).
    Forward numbers stay right; needs a family with root parameters (vit, vit_mha) and an
    FSDP2 layout (fsdp, hsdp).
  - shared_bias_first_use: under FSDP2, T5's relative position bias reaches the later blocks
    of a stack detached (as a block unit that hooks the gradient of its first output only),
    so its weight's gradient holds the first block's use alone. Forward numbers stay right;
    needs family=encdec, an FSDP2 layout and a second block (one block hands the bias on to
    no one).
  - pad_tokens_counted: the step's token count that normalizes torchtitan's / HF's loss counts
    every label position, pads included (`labels.numel()`, a normalizer that forgets
    ignore_index): every gradient comes out scaled by the valid share of the batch. Quiet and
    uniform; needs padded rows (pad) and a global-token loss (loss=tokens or items): without
    padding every position is a valid token, and a shard's mean never counts.
  - compiled_silu_drift: a compiler graph pass that gets a lowering wrong: every SiLU in a
    compiled graph comes out (1 + 1e-3) times too large (as a fusion or decomposition with a
    wrong constant). It lives in the compiler (a pass in model_compile.GRAPH_PASSES, run
    over Dynamo's graph before the backend), so eager never shows it: needs compile (blocks or model) and a SiLU inside
    the compiled region (the LM's feed-forward).

The plants of other layouts leave a pipeline alone (their hooks are written for one model,
a pipeline rank holds stages); the pipeline's plants get the model_pipeline.Pipelined.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.nn as nn

from .model_compile import GRAPH_PASSES
from .model_space import PIPELINED

PLANT_ENV = "DISTCI_MODELS_PLANT"


def _buffer_drift(model: nn.Module, parallel: str, rank: int) -> None:
    if rank == 0:
        return
    with torch.no_grad():
        for block in model.layers:
            for name in ("cos", "sin", "scale"):
                if hasattr(block, name):
                    getattr(block, name).mul_(1.01)


def _tied_grad_once(model: nn.Module, parallel: str, rank: int) -> None:
    if parallel != "fsdp" or not model.structure["tie"]:
        return
    head = model.output

    def head_without_weight_grad(module, args, output):
        (x,) = args
        return torch.nn.functional.linear(x, module.weight.detach())

    head.register_forward_hook(head_without_weight_grad)


class _Stale(torch.autograd.Function):
    """Adds `stale` to `weight`'s gradient and nothing to the forward."""

    @staticmethod
    def forward(ctx, x, weight, stale):
        ctx.save_for_backward(stale)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        (stale,) = ctx.saved_tensors
        return grad, stale, None


def _idle_expert_stale(model: nn.Module, parallel: str, rank: int) -> None:
    from .model_structures import LoopMoE

    for moe in (m for m in model.modules() if isinstance(m, LoopMoE)):
        last: dict[int, torch.Tensor] = {}
        hooked: set[int] = set()
        for e, expert in enumerate(moe.experts):
            def keep(module, args, output, e=e):
                w = module.w1.weight
                if w.requires_grad and not hasattr(w, "placements") and id(w) not in hooked:
                    hooked.add(id(w))
                    w.register_hook(lambda g, e=e: last.__setitem__(e, g.detach().clone()))
            expert.register_forward_hook(keep)

        def stale_into_skipped(module, args, output, last=last):
            for e in module.skipped:
                w = module.experts[e].w1.weight
                if e in last and last[e].shape == w.shape:
                    output = _Stale.apply(output, w, last[e])
            return output

        moe.register_forward_hook(stale_into_skipped)


def _frozen_grad(model: nn.Module, parallel: str, rank: int) -> None:
    if parallel not in ("fsdp", "hsdp"):
        return
    frozen = [p for p in model.parameters() if not p.requires_grad]

    def zero_grads(module, args, output):
        def at_backward(grad):
            for p in frozen:
                p.grad = torch.zeros_like(p)
            return grad
        if output.requires_grad:
            output.register_hook(at_backward)
    model.register_forward_hook(zero_grads)


def _recompute_drift(model: nn.Module, parallel: str, rank: int) -> None:
    from .model_structures import Expert

    if parallel != "fsdp":
        return

    def drift(module, args, output):
        return output * (1 + 1e-3) if torch._C._current_graph_task_id() != -1 else output
    for expert in [m for m in model.modules() if isinstance(m, Expert)]:
        expert.w1.register_forward_hook(drift)


def _balance_local_counts(model: nn.Module, parallel: str, rank: int) -> None:
    model.balance_groups = []


def _dp_first_axis(model: nn.Module, parallel: str, rank: int) -> None:
    model.balance_groups = model.balance_groups[:1]


def _sp_norm_grad_local(model: nn.Module, parallel: str, rank: int) -> None:
    import torch.nn.functional as F

    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, getattr(nn, "RMSNorm", ())) or not hasattr(weight, "to_local"):
            continue

        def forward(x, module=module):
            from torch.distributed.tensor import DTensor

            out = F.rms_norm(x.to_local(), module.normalized_shape, module.weight.to_local(), module.eps)
            return DTensor.from_local(out, x.device_mesh, x.placements, run_check=False)
        module.forward = forward


def _pp_tied_unsummed(piped, parallel: str, rank: int) -> None:
    if parallel in PIPELINED:
        piped.sum_tied = False


def _pp_stage_unscaled(piped, parallel: str, rank: int) -> None:
    if parallel not in PIPELINED or piped.structure["schedule"] != "interleaved_1f1b":
        return
    for stage in piped.stages:
        if stage.is_last:
            stage.scale_grads = lambda grad_scale_factor: None


def _pp_tp_tied_world(piped, parallel: str, rank: int) -> None:
    if parallel == "pp_tp":
        piped.tied_group = None


def _root_param_unreduced(model: nn.Module, parallel: str, rank: int) -> None:
    if parallel not in ("fsdp", "hsdp") or rank == 0 or not hasattr(model, "cls_token"):
        return

    def embed(images: torch.Tensor) -> torch.Tensor:
        def zero_share(p: torch.Tensor) -> torch.Tensor:  # the value, with a zero gradient
            return p.detach() + 0 * p
        x = model.patch_embed(images)
        cls = zero_share(model.cls_token).expand(x.shape[0], -1, -1)
        return torch.cat([cls, x], dim=1) + zero_share(model.pos_embed)
    model.embed = embed


def _shared_bias_first_use(model: nn.Module, parallel: str, rank: int) -> None:
    if parallel not in ("fsdp", "hsdp") or not hasattr(model, "encoder"):
        return

    def detach_bias(module, args, output):
        return output[0], output[1].detach()
    for stack in (model.encoder, model.decoder):
        stack.layers[0].register_forward_hook(detach_bias)


PIPELINE_PLANTS = ("pp_tied_unsummed", "pp_stage_unscaled", "pp_tp_tied_world")

def _pad_tokens_counted(model: nn.Module, parallel: str, rank: int) -> None:
    model.count_tokens = lambda labels: torch.tensor(labels.numel())


COMPILER_PLANTS = ("compiled_silu_drift",)
"""Plants that live in the compiler (model_compile.GRAPH_PASSES): the model itself is left alone."""
SILU_DRIFT = 1e-3


def _silu_drift(gm: torch.fx.GraphModule) -> None:
    """Every SiLU of Dynamo's graph, its output times 1 + SILU_DRIFT."""
    import operator

    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.nn.functional.silu:
            with gm.graph.inserting_after(node):
                drifted = gm.graph.call_function(operator.mul, (node, 1.0 + SILU_DRIFT))
            node.replace_all_uses_with(drifted, delete_user_cb=lambda user: user is not drifted)
    gm.recompile()


if os.environ.get(PLANT_ENV, "") == "compiled_silu_drift":  # installed before any structure compiles
    GRAPH_PASSES.append(_silu_drift)


PLANTS: dict[str, Callable[[nn.Module, str, int], None]] = {
    "buffer_drift": _buffer_drift, "tied_grad_once": _tied_grad_once, "idle_expert_stale": _idle_expert_stale,
    "frozen_grad": _frozen_grad, "recompute_drift": _recompute_drift, "balance_local_counts": _balance_local_counts,
    "dp_first_axis": _dp_first_axis,
    "sp_norm_grad_local": _sp_norm_grad_local, "pp_tied_unsummed": _pp_tied_unsummed,
    "pp_stage_unscaled": _pp_stage_unscaled, "pp_tp_tied_world": _pp_tp_tied_world,
    "root_param_unreduced": _root_param_unreduced, "shared_bias_first_use": _shared_bias_first_use,
    "pad_tokens_counted": _pad_tokens_counted, "compiled_silu_drift": lambda model, parallel, rank: None}


def plant(model: nn.Module, parallel: str, rank: int, name: str | None = None) -> None:
    """Plants $DISTCI_MODELS_PLANT (or `name`) into the parallel run's model, after parallelize
    (under pp: into the model_pipeline.Pipelined, its stages built)."""
    name = os.environ.get(PLANT_ENV, "") if name is None else name
    if not name:
        return
    if name not in PLANTS:
        raise ValueError(f"{PLANT_ENV}={name!r} is not a plant; plants: {', '.join(PLANTS)}")
    if (parallel in PIPELINED) == (name in PIPELINE_PLANTS):
        PLANTS[name](model, parallel, rank)
