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

from collections import Counter, defaultdict
from typing import Any, Callable

import torch
import torch.nn as nn

from .models import MoE, TPStyles, Transformer, tp_plan
from .tying import retie

FLOAT8_SKIP_FQNS = ("output",)
"""Linears left in high precision, as torchtitan's default `filter_fqns`."""


MP_PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The `mp` column's FSDP2 param_dtype (gradients reduce in float32 either way)."""

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


class PostGradOpCounter:
    """An inductor post-grad pass that records which ops each compiled graph holds.

    It runs after inductor's own post-grad passes (micro-pipeline TP included), so a
    fused symmetric-memory op counted here is one inductor really emitted. A plain
    callable (not a CustomGraphPass with a uuid) on purpose: it makes inductor bypass its
    FX graph cache, so the pass sees every graph instead of a cache hit.
    """

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()
        self.graphs = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.graphs += 1
        for node in graph.nodes:
            if node.op == "call_function":
                self.ops[op_name(node.target)] += 1


FSDP_LAYOUTS = ("fsdp", "fsdp_tp", "hsdp")


def fsdp_api() -> tuple[Callable, type]:
    """(fully_shard, MixedPrecisionPolicy) where this torch keeps them (public since 2.6)."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def _cpu_offload_policy(device_type: str) -> Any:
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy
    except ImportError:
        from torch.distributed._composable.fsdp import CPUOffloadPolicy
    return CPUOffloadPolicy(pin_memory=device_type != "cpu")


def reshard_after_forward(n_layers: int, mode: str = "titan") -> list[bool | int]:
    """Per block, FSDP2's reshard_after_forward for the `reshard` column. torchtitan's
    default (`titan`): every block but the last, whose backward starts right after its
    forward; `true` / `false`: every block; `int2`: reshard to 2-rank groups. The root
    module is never resharded."""
    if mode == "titan":
        return [i < n_layers - 1 for i in range(n_layers)]
    value = {"true": True, "false": False, "int2": 2}[mode]
    return [value] * n_layers


def resharded_blocks(n_layers: int, reshard: bool = True, mode: str = "titan") -> list[bool]:
    """Per block: does FSDP2 free its unsharded weights after forward (so it all-gathers
    again in backward)? `reshard=False` is the mutation of a block that never reshards."""
    return [reshard and bool(r) for r in reshard_after_forward(n_layers, mode)]


def apply_fsdp(model: Transformer, mesh: Any, mp: str, reshard: bool = True, mode: str = "titan",
               offload: bool = False, reduce_dtype: torch.dtype | None = None) -> None:
    """FSDP2 as torchtitan's apply_fsdp: fully_shard every block, then the root.

    A tied model (args.tie) groups the token embedding, the final norm and the output in
    one unit, as torchtitan 0.3's apply_fsdp_to_decoder does (one fully_shard over the
    three modules: the shared weight is gathered and reduced once), resharded after
    forward never (its policy's default); the root then holds no parameter.

    mp `bf16` / `fp16`: parameters all-gathered and computed in that dtype, gradients reduce-scattered
    in float32 (torchtitan's mixed_precision_param / mixed_precision_reduce defaults).
    A 2-D mesh (dp_replicate, dp_shard) is HSDP. `reshard=False` and `reduce_dtype` are
    mutations: no block ever frees its unsharded weights; gradients reduce in that dtype.
    """
    fully_shard, MixedPrecisionPolicy = fsdp_api()
    if mp in MP_PARAM_DTYPES:
        policy = MixedPrecisionPolicy(param_dtype=MP_PARAM_DTYPES[mp], reduce_dtype=reduce_dtype or torch.float32)
    else:
        policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype) if reduce_dtype else MixedPrecisionPolicy()
    extra = {"offload_policy": _cpu_offload_policy(mesh.device_type)} if offload else {}
    if model.args.tie:
        fully_shard([model.tok_embeddings, model.norm, model.output], mesh=mesh, mp_policy=policy,
                    reshard_after_forward=False, **extra)
    blocks = list(model.layers.named_children())
    for (name, block), again, on in zip(blocks, reshard_after_forward(len(blocks), mode),
                                        resharded_blocks(len(blocks), reshard, mode)):
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=again if on else False, **extra)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False, **extra)


class ExpertParallel:
    """Expert-parallel dispatch for a MoE block: each rank owns n_experts / ws experts.

    Tokens are sorted by the expert they were routed to, sent to the experts' owners with
    one all-to-all (uneven splits: the counts are exchanged first), run through the local
    experts and sent back with a second all-to-all, as torchtitan's expert parallel does.
    Uses the differentiable functional all_to_all_single; torch builds without it
    cannot run EP rows. Dense weights stay replicated (data parallel, gradients
    averaged by the runner); experts' gradients come from every rank's tokens.
    """

    def __init__(self, group: Any, rank: int, size: int, n_experts: int) -> None:
        if n_experts % size:
            raise ValueError(f"{n_experts} experts cannot be split over {size} ranks")
        self.group, self.rank, self.size = group, rank, size
        self.local = n_experts // size
        self.n_experts = n_experts

    def owns(self, expert: int) -> bool:
        return expert // self.local == self.rank

    def __call__(self, moe: MoE, tokens: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        flat = chosen.flatten()
        order = flat.argsort(stable=True)
        token_idx = order // chosen.shape[1]
        gate = weights.flatten()[order].unsqueeze(-1)
        counts = torch.bincount(flat, minlength=self.n_experts)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)  # [src][local expert]
        send_split = counts.view(self.size, self.local).sum(1).tolist()
        recv_matrix = recv_counts.view(self.size, self.local)
        recv_split = recv_matrix.sum(1).tolist()
        received = all_to_all_single_autograd(tokens[token_idx], recv_split, send_split, self.group)
        chunks = list(received.split(recv_matrix.flatten().tolist()))
        outs = [None] * len(chunks)
        for e in range(self.local):
            expert = moe.experts[self.rank * self.local + e]
            mine = [src * self.local + e for src in range(self.size)]
            y = expert(torch.cat([chunks[i] for i in mine]))
            for i, part in zip(mine, y.split([chunks[i].shape[0] for i in mine])):
                outs[i] = part
        returned = all_to_all_single_autograd(torch.cat(outs), send_split, recv_split, self.group)
        return torch.zeros_like(tokens).index_add(0, token_idx, returned * gate)


def apply_ep(model: Transformer, group: Any) -> ExpertParallel:
    """Switches every MoE block to expert-parallel dispatch over `group`."""
    import torch.distributed as dist

    ep = ExpertParallel(group, dist.get_rank(group), dist.get_world_size(group), model.args.n_experts)
    for block in model.layers.values():
        block.feed_forward.dispatch = ep
    return ep


def apply_ep_fsdp(model: Transformer, ep_mesh: Any, efsdp_mesh: Any, dp_mesh: Any, mp: str,
                  reduce_dtype: torch.dtype | None = None, divide: bool = True) -> ExpertParallel:
    """Expert parallel laid out as torchtitan 0.3's `parallelize` for MoE models does.

    Experts are split over `ep_mesh` (each rank keeps only the experts it owns; the
    others are removed from its model, as torchtitan's Shard(0) expert weights hold the
    local experts only) and FSDP2-sharded over `efsdp_mesh`, the ranks that own the same
    experts; every block (attention, norms, router) and the root are FSDP2-sharded over
    `dp_mesh`, every rank. Gradients therefore live on two meshes. An expert's gradient
    sums the tokens of its whole ep group, so its reduction divides by the data-parallel
    size, not the efsdp size (torchtitan's `set_gradient_divide_factor`; `divide=False` is
    the mutation that leaves FSDP2's default).
    """
    fully_shard, MixedPrecisionPolicy = fsdp_api()
    if mp in MP_PARAM_DTYPES:
        policy = MixedPrecisionPolicy(param_dtype=MP_PARAM_DTYPES[mp], reduce_dtype=reduce_dtype or torch.float32)
    else:
        policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype) if reduce_dtype else MixedPrecisionPolicy()
    ep = ExpertParallel(ep_mesh.get_group(), ep_mesh.get_local_rank(), ep_mesh.size(), model.args.n_experts)
    blocks = list(model.layers.values())
    for block in blocks:
        moe = block.feed_forward
        moe.dispatch = ep
        for e in range(ep.n_experts):
            if not ep.owns(e):
                moe.experts[e] = nn.Module()  # not this rank's: no parameters here
        for e in range(ep.n_experts):
            if ep.owns(e):
                expert = moe.experts[e]
                fully_shard(expert, mesh=efsdp_mesh, mp_policy=policy, reshard_after_forward=False)
                if divide:
                    setter = getattr(expert, "set_gradient_divide_factor", None) or \
                        expert.set_reduce_scatter_divide_factor
                    setter(float(dp_mesh.size()))
    for block, again in zip(blocks, reshard_after_forward(len(blocks))):
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=again)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=False)
    return ep


def ddp_comm_hook(name: str) -> Callable | None:
    """The communication hook a ddp row registers (`ddp_hook` column), or None."""
    if name == "none":
        return None
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    return {"bf16": bf16_compress_hook}[name]


def apply_ddp(model: nn.Module, mesh: Any, bucket_cap_mb: float, static_graph: bool = False,
              find_unused_parameters: bool = False, hook: Callable | None = None) -> nn.Module:
    """Classic DistributedDataParallel over the mesh's group, as users wrap a model: the
    wrapper is what they call (and compile); the model keeps its parameter names. Gradients
    are averaged in buckets of `bucket_cap_mb` by the C++ reducer (or `hook`)."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, process_group=mesh.get_group(), bucket_cap_mb=bucket_cap_mb,
                                  static_graph=static_graph, find_unused_parameters=find_unused_parameters)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    return ddp


def apply_replicate(model: nn.Module, mesh: Any, bucket_cap_mb: float, compiled: bool,
                    find_unused_parameters: bool = False) -> None:
    """Composable DDP as torchtitan's `apply_ddp` applies it when dp_replicate > 1 without
    FSDP: Dynamo's DDPOptimizer when compiled, then `replicate(model, device_mesh=...)`.
    (torchtitan sets `optimize_ddp` globally; the caller patches it for the run.)"""
    from torch.distributed._composable.replicate import replicate

    kwargs = {"find_unused_parameters": True} if find_unused_parameters else {}
    replicate(model, device_mesh=mesh, bucket_cap_mb=bucket_cap_mb, **kwargs)


def ddp_of(runnable: nn.Module, model: nn.Module) -> Any:
    """The DistributedDataParallel instance behind a ddp or replicate layout."""
    from torch.nn.parallel import DistributedDataParallel

    inner = getattr(runnable, "_orig_mod", runnable)
    if isinstance(inner, DistributedDataParallel):
        return inner
    from torch.distributed._composable.replicate import replicate

    return replicate.state(model)._ddp


def ddp_buckets(ddp: Any) -> int:
    """Gradient buckets DDP's reducer holds now (it all-reduces each once a synchronized
    step; it rebuilds them after the first step, after the second under static_graph,
    which its logging data does not record: the reducer's own list is asked first)."""
    buckets = getattr(ddp.reducer, "_get_zeros_like_grad_buckets", None)
    if buckets is not None:
        return len(buckets())
    data = ddp._get_ddp_logging_data()
    sizes = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "")
    return len([s for s in sizes.split(",") if s.strip()])


def gradient_sync(runnable: nn.Module, model: nn.Module, parallel: str) -> Callable[[bool], Any]:
    """sync(on) -> a context for one microbatch: on=False skips the gradient all-reduce
    (DDP's no_sync(), replicate's set_requires_gradient_sync(False)): under grad_sync=last
    accumulation all-reduces once per step, in its last microbatch."""
    import contextlib

    if parallel == "ddp":
        ddp = getattr(runnable, "_orig_mod", runnable)
        return lambda on: contextlib.nullcontext() if on else ddp.no_sync()

    @contextlib.contextmanager
    def replicate_sync(on: bool):
        model.set_requires_gradient_sync(on)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return replicate_sync


def restoring_active_ddp_module() -> Any:
    """A context that puts DistributedDataParallel._active_ddp_module (what Dynamo asks
    to decide on DDPOptimizer) back on exit: a compiled DDP forward that raises, or a
    replicated one (replicate sets it in a forward pre-hook, clears it in the post-hook),
    leaves it set, and every later torch.compile in the rank's process would split its
    graphs for that stale module (suites/regressions/test_ddp_optimizer_first_bucket.py)."""
    import contextlib

    from torch.nn.parallel import DistributedDataParallel

    @contextlib.contextmanager
    def restore():
        before = DistributedDataParallel._get_active_ddp_module()
        try:
            yield
        finally:
            DistributedDataParallel._active_ddp_module = before

    return restore()
