"""Applies a scenario's features to a model in torchtitan's order and with its code paths.

torchtitan's `parallelize_llama` does: Float8 conversion (a model converter, before
parallelizing), tensor parallel (+ async TP), activation checkpointing per block,
torch.compile per block or whole model, then FSDP2 (fully_shard per block, then the
root) on the data-parallel mesh dim. Bugs live in how these compose, so we compose
them the same way, with the same upstream APIs (parallelize_module, checkpoint_wrapper,
create_selective_checkpoint_contexts, torchao's convert_to_float8_training and Float8
TP styles, symmetric memory).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch
import torch.nn as nn

from .models import TPStyles, Transformer, tp_plan
from .tying import retie

FLOAT8_SKIP_FQNS = ("output",)
"""Linears left in high precision, as torchtitan's default `filter_fqns`."""



def float8_config(recipe: str, fsdp_float8_all_gather: bool = False):
    """torchao's Float8LinearConfig for a recipe name, across torchao releases.

    `fsdp_float8_all_gather` (tensorwise only): FSDP2 all-gathers the weights in float8,
    torchtitan's `enable_fsdp_float8_all_gather`.
    """
    import dataclasses

    from torchao.float8 import Float8LinearConfig

    if hasattr(Float8LinearConfig, "from_recipe_name"):
        config = Float8LinearConfig.from_recipe_name(recipe)
    elif recipe == "tensorwise":
        config = Float8LinearConfig()
    else:
        from torchao.float8.config import recipe_name_to_linear_config  # torchao < 0.10

        config = recipe_name_to_linear_config(recipe)
    if fsdp_float8_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    return config


def default_float8_filter(module: nn.Module, fqn: str) -> bool:
    return isinstance(module, nn.Linear) and not any(fqn == s or fqn.endswith("." + s) for s in FLOAT8_SKIP_FQNS)


def convert_float8(model: nn.Module, recipe: str, module_filter: Callable[[nn.Module, str], bool] | None = None,
                   fsdp_float8_all_gather: bool = False) -> int:
    """Swaps eligible nn.Linear for torchao Float8Linear; returns how many were swapped."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model, config=float8_config(recipe, fsdp_float8_all_gather),
                               module_filter_fn=module_filter or default_float8_filter)
    return count_float8_linears(model)


def precompute_float8_scales(model: nn.Module) -> None:
    """After each optimizer step: one all-reduce of every float8 weight's amax (torchtitan's
    `precompute_float8_dynamic_scale_for_fsdp`) instead of one per weight per all-gather."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def count_float8_all_gather_weights(model: nn.Module) -> int:
    """Parameters whose FSDP2 shards are torchao's float8-all-gathering weight subclass."""
    n = 0
    for p in model.parameters():
        local = getattr(p, "_local_tensor", p)
        n += type(local).__name__ == "WeightWithDynamicFloat8CastTensor"
    return n


def count_float8_linears(model: nn.Module) -> int:
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())


def apply_tp(model: Transformer, mesh: Any, plan: str, float8: str, block_overrides: dict | None = None,
             loss_parallel: bool = False) -> None:
    """Shards `model` in place with the plan; `block_overrides` replaces per-block entries."""
    from torch.distributed.tensor.parallel import parallelize_module

    top, block = tp_plan(plan, TPStyles.for_float8(float8), model.args, loss_parallel)
    top = {k: v for k, v in top.items() if getattr(model, k, None) is not None}  # a pipeline stage holds some
    block = {**block, **(block_overrides or {})}
    parallelize_module(model, mesh, top)
    retie(model)  # both vocab-sharded Shard(0): the embedding's DTensor parameter serves the output too
    for layer in model.layers.values():
        parallelize_module(layer, mesh, block)


def enable_async_tp(mesh: Any) -> None:
    """Micro-pipeline TP: inductor fuses collectives with matmuls over symmetric memory.

    The caller patches `torch._inductor.config._micro_pipeline_tp`; this enables symmetric
    memory for the TP group (a no-op with a warning on torch versions that always enable it).
    """
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    enable_symm_mem_for_group(mesh.get_group().group_name)


def _sac_save_list() -> set:
    """Ops whose outputs torchtitan's selective-AC policy saves (others are recomputed)."""
    names = (
        ("aten", "mm"),
        ("aten", "_scaled_mm"),
        ("aten", "_scaled_dot_product_efficient_attention"),
        ("aten", "_scaled_dot_product_flash_attention"),
        ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
        ("aten", "_scaled_dot_product_cudnn_attention"),
        ("_c10d_functional", "reduce_scatter_tensor"),
        ("aten", "max"),
    )
    ops = set()
    for ns, name in names:
        packet = getattr(getattr(torch.ops, ns), name, None)
        if packet is not None and hasattr(packet, "default"):
            ops.add(packet.default)
    return ops


def _selective_context_fn():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = _sac_save_list()
    mm = torch.ops.aten.mm.default
    meta: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute_mm" if ctx.is_recompute else "forward_mm"
        if func == mm:
            meta[key] += 1
        keep = func in save and not (func == mm and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_ac(model: Transformer, mode: str) -> None:
    """Wraps every block: `full` recomputes it whole, `selective` uses torchtitan's op policy."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name, block in list(model.layers.named_children()):
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        elif mode == "selective":
            wrapped = checkpoint_wrapper(block, context_fn=_selective_context_fn, preserve_rng_state=False)
        else:
            raise ValueError(f"unknown AC mode {mode!r}; known: none, full, selective")
        model.layers.register_module(name, wrapped)


class CompileCounter:
    """A torch.compile backend that counts the graphs Dynamo hands it, then delegates.

    One call per graph Dynamo compiles: a graph break adds one, a recompile adds one, a
    silent fallback to eager adds none. Counting at the backend works on every torch
    version, unlike the names inside torch._dynamo.utils.counters. `calls` counts the
    compiled graphs' (forward) runs: a step whose frames fell back to eager (a recompile
    limit hit) adds none.
    """

    def __init__(self, backend: str) -> None:
        from torch._dynamo.backends.registry import lookup_backend

        self.name = backend
        self.inner = lookup_backend(backend)
        self.graphs = 0
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs += 1
        compiled = self.inner(gm, example_inputs)

        def run(*args: Any) -> Any:
            self.calls += 1
            return compiled(*args)

        return run


def apply_compile(model: Transformer, mode: str, backend: Callable | str, fullgraph: bool = True) -> nn.Module:
    """`block`: each block compiled on its own (torchtitan's default); `model`: one graph.

    `fullgraph=False` only for a whole model under FSDP2, whose hooks Dynamo may not
    trace (they are torch._dynamo.disable'd): the graph breaks there, by design; and for a
    whole DDP / replicated model, whose forward Dynamo does not trace into a graph (DDP's
    pre-forward logging): the inner model's forward is the graph, split by DDPOptimizer.
    """
    if mode == "none":
        return model
    if mode == "block":
        for name, block in list(model.layers.named_children()):
            model.layers.register_module(name, torch.compile(block, backend=backend, fullgraph=True))
        return model
    if mode == "model":
        return torch.compile(model, backend=backend, fullgraph=fullgraph)
    raise ValueError(f"unknown compile mode {mode!r}; known: none, block, model")


def op_name(target: Any) -> str:
    """`namespace::name` of an op, the spelling the profiler uses (aten::_scaled_mm)."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name
    qualified = getattr(target, "_qualified_op_name", None)
    if qualified:
        return qualified
    return getattr(target, "__name__", str(target))


# The layouts' own modules; re-exported so `parallelize` stays the one name the runner applies them by.
from .data_parallel import (  # noqa: E402,F401
    apply_ddp, apply_replicate, ddp_buckets, ddp_comm_hook, ddp_of, gradient_sync, restoring_active_ddp_module)
from .expert_parallel import ExpertParallel, apply_ep, apply_ep_fsdp  # noqa: E402,F401
from .fsdp import (  # noqa: E402,F401
    FSDP_LAYOUTS, MP_PARAM_DTYPES, apply_fsdp, fsdp_api, mp_policy, reshard_after_forward, resharded_blocks)
