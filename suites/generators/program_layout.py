"""How the programs generator lays its model out (distci/training_program.py's layouts) and the
FSDP2 methods trainers call on the laid-out model between steps (the `reshard` action's forms,
`eval=generate`'s forward method, `compile=blocks`).

Vocabulary, as torchtitan's `distributed/parallel_dims.py` writes it: an **axis** is a mesh
dimension (`dp_replicate`, `dp_shard`, `tp`); a **dim** is a tensor dimension. The
data-parallel **group** is the one the loss and metrics are averaged over: the whole world
for fsdp / ddp, the `dp` axis of fsdp_tp, and for hsdp the `dp_replicate` x `dp_shard` axes
flattened into one (`_flatten("dp")`, ParallelDims' data-loading and loss mesh).

The methods here change how FSDP2 moves parameters and gradients, never what a step computes,
so the single-process reference does nothing for them; a divergence after one is the method's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..runner.fsdp import cpu_offload_policy
from ..runner.models import TPStyles
from ..runner.parallelize import fsdp_api
from .program_checkpointing import apply as checkpoint_blocks


@dataclass
class Parallel:
    """How the run is laid out on this rank."""

    layout: str
    dp_rank: int = 0
    dp_size: int = 1
    dp_group: Any = None
    rank: int = 0
    checkpointing: str = ""
    """How the blocks checkpoint their activations (program_checkpointing.KINDS; "" not at all)."""


def layout_model(model: nn.Module, layout: str, dist: Any, checkpointing: str = "") -> tuple[nn.Module, Parallel]:
    """(runnable, parallel facts): FSDP2 per block then the root (torchtitan's order; fsdp_mp:
    bfloat16 compute, float32 reduction, torchtitan's and torchtune's default policy; hsdp: a
    (dp_replicate, dp_shard) mesh, sharded within a replica and replicated across them), TP
    with w1 column- and w2 row-wise (a 2x2 mesh for fsdp_tp, TP inner), or DDP; `checkpointing`:
    the blocks' activation checkpointing kind (program_checkpointing.py), after TP and before
    FSDP2 or DDP, torchtitan's order."""
    import torch.distributed as tdist

    rank = tdist.get_rank()
    if layout == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        checkpoint_blocks(model, checkpointing)
        mesh = dist.mesh()
        return DistributedDataParallel(model, process_group=mesh.get_group()), \
            Parallel(layout, rank, dist.world_size, mesh.get_group(), rank, checkpointing)
    dp_group_mesh = None
    if layout == "fsdp_tp":
        mesh = dist.mesh((2, dist.world_size // 2), ("dp", "tp"))
        dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
    elif layout in ("tp", "tp_f8"):
        dp_mesh, tp_mesh = None, dist.mesh()
    elif layout == "hsdp":  # ParallelDims: the FSDP mesh is the two dp axes, the loss's their flattening
        mesh = dist.mesh((2, dist.world_size // 2), ("dp_replicate", "dp_shard"))
        dp_mesh, tp_mesh = mesh["dp_replicate", "dp_shard"], None
        dp_group_mesh = dp_mesh._flatten("dp")
    else:
        dp_mesh, tp_mesh = dist.mesh(), None
    if tp_mesh is not None:  # tp_f8: torchao's Float8 styles (float8 casts before the collectives)
        from torch.distributed.tensor.parallel import parallelize_module

        styles = TPStyles.for_float8("tensorwise" if layout == "tp_f8" else "none")
        for block in model.blocks:
            parallelize_module(block, tp_mesh, {"w1": styles.colwise(), "w2": styles.rowwise()})
    checkpoint_blocks(model, checkpointing)
    if dp_mesh is None:
        return model, Parallel(layout, rank=rank, checkpointing=checkpointing)
    fully_shard, policy = fsdp_api()
    mp = {"mp_policy": policy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} if layout == "fsdp_mp" else {}
    if layout == "fsdp_offload":
        mp = {"offload_policy": cpu_offload_policy(dp_mesh.device_type)}
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh, **mp)
    fully_shard(model, mesh=dp_mesh, **mp)
    _register_generate(model)
    dp_group_mesh = dp_group_mesh or dp_mesh
    return model, Parallel(layout, dp_group_mesh.get_local_rank(), dp_group_mesh.size(), dp_group_mesh.get_group(),
                           rank, checkpointing)


def _register_generate(model: nn.Module) -> None:
    """FSDP2 runs its unshard only around `forward`; a generate-style method that calls the
    blocks and the head itself needs `register_fsdp_forward_method` (transformers' generate
    under accelerate's FSDP2, torchtune's and TRL's generation for RL), or the root's own
    parameters stay sharded in it."""
    try:
        from torch.distributed.fsdp import register_fsdp_forward_method
    except ImportError:  # torch < 2.6: the composable path
        from torch.distributed._composable.fsdp import register_fsdp_forward_method
    register_fsdp_forward_method(model, "generate")


def accumulate_in_param_dtype(model: nn.Module) -> None:
    """The mp_accumulate_low plant (program_plants.py): every FSDP2 parameter of `model` skips
    its upcast of a no-sync gradient to the reduce dtype."""
    for group in _param_groups(model):
        for fsdp_param in group.fsdp_params:
            fsdp_param.to_accumulated_grad_if_needed = lambda: None


def _param_groups(model: nn.Module) -> list:
    out = []
    for module in model.modules():
        if not hasattr(module, "_get_fsdp_state"):
            continue
        state = module._get_fsdp_state()
        out += filter(None, getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)])
    return out


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """The FSDP2 modules of `model`, root first (modules() order)."""
    return [m for m in model.modules() if hasattr(m, "set_reshard_after_backward")]


def fsdp_method(model: nn.Module, arg: str, dp_size: int) -> bool:
    """The `reshard` action's form `arg` on every FSDP2 module of the run (FORMS of
    distci/training_program.py). Returns whether the loss is now to be divided by the
    data-parallel size before backward (`divide`: FSDP2 sums, the loop normalizes)."""
    modules = fsdp_modules(model)
    if arg in ("false", "true"):  # torchtitan/torchtune accumulation: keep unsharded params between microbatches
        for m in modules:
            m.set_reshard_after_backward(arg == "true")
    elif arg == "forward_false":  # torchtitan reshard_after_forward_policy "never"; torchtune's generation
        for m in modules:
            if hasattr(m, "set_reshard_after_forward"):  # torch >= 2.7
                m.set_reshard_after_forward(False)
    elif arg == "prefetch":  # torchtitan apply_fsdp with EP: explicit prefetch, block i -> i + 1 / i - 1
        blocks = list(model.blocks)
        for before, after in zip(blocks, blocks[1:]):
            before.set_modules_to_forward_prefetch([after])
            after.set_modules_to_backward_prefetch([before])
    elif arg == "unshard":  # torchtitan's chunked loss (unshard while idle), torchtune's recursive_reshard
        for m in modules:
            m.unshard()
        for m in reversed(modules):
            m.reshard()
    elif arg == "divide":  # torchtitan disable_fsdp_gradient_division + global token count
        if not all(hasattr(m, "set_gradient_divide_factor") for m in modules):
            return False  # torch < 2.6 names it otherwise: nothing to exercise
        for m in modules:
            m.set_gradient_divide_factor(1.0)
        return True
    else:
        raise ValueError(f"the programs runner has no reshard form {arg!r}")
    return False


def compile_blocks(model: nn.Module, backend: str) -> None:
    """torchtitan's apply_compile, per block (`nn.Module.compile`: in place, so FSDP2's and
    TP's hooks and the module tree stay as they were); the reference stays eager."""
    for block in model.blocks:
        block.compile(backend=backend)
