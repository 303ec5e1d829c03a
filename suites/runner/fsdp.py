"""FSDP2 as torchtitan applies it: where fully_shard lives in this torch, the `mp` column's
MixedPrecisionPolicy, reshard_after_forward per block, and apply_fsdp (every block, then
the root). The layouts that shard the whole model as one are FSDP_LAYOUTS.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .models import Transformer

MP_PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The `mp` column's FSDP2 param_dtype (gradients reduce in float32 either way)."""


FSDP_LAYOUTS = ("fsdp", "fsdp_tp", "hsdp")


def fsdp_api() -> tuple[Callable, type]:
    """(fully_shard, MixedPrecisionPolicy) where this torch keeps them (public since 2.6)."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def mp_policy(mp: str, reduce_dtype: torch.dtype | None = None) -> Any:
    """The MixedPrecisionPolicy of the `mp` column (`reduce_dtype`: the mutation that reduces
    gradients in another dtype)."""
    _, MixedPrecisionPolicy = fsdp_api()
    if mp in MP_PARAM_DTYPES:
        return MixedPrecisionPolicy(param_dtype=MP_PARAM_DTYPES[mp], reduce_dtype=reduce_dtype or torch.float32)
    return MixedPrecisionPolicy(reduce_dtype=reduce_dtype) if reduce_dtype else MixedPrecisionPolicy()


def cpu_offload_policy(device_type: str) -> Any:
    """FSDP2's CPUOffloadPolicy where this torch keeps it (pinned memory only off CPU)."""
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
               offload: bool = False, reduce_dtype: torch.dtype | None = None, prefetch: str = "implicit") -> None:
    """FSDP2 as torchtitan's apply_fsdp: fully_shard every block, then the root.

    A tied model (args.tie) groups the token embedding, the final norm and the output in
    one unit, as torchtitan 0.3's apply_fsdp_to_decoder does (one fully_shard over the
    three modules: the shared weight is gathered and reduced once), resharded after
    forward never (its policy's default); the root then holds no parameter.

    mp `bf16` / `fp16`: parameters all-gathered and computed in that dtype, gradients reduce-scattered
    in float32 (torchtitan's mixed_precision_param / mixed_precision_reduce defaults).
    A 2-D mesh (dp_replicate, dp_shard) is HSDP. `reshard=False` and `reduce_dtype` are
    mutations: no block ever frees its unsharded weights; gradients reduce in that dtype.
    `prefetch`: the `prefetch` column (`explicit_prefetch`).
    """
    fully_shard, _ = fsdp_api()
    policy = mp_policy(mp, reduce_dtype)
    extra = {"offload_policy": cpu_offload_policy(mesh.device_type)} if offload else {}
    if model.args.tie:
        fully_shard([model.tok_embeddings, model.norm, model.output], mesh=mesh, mp_policy=policy,
                    reshard_after_forward=False, **extra)
    blocks = list(model.layers.named_children())
    for (name, block), again, on in zip(blocks, reshard_after_forward(len(blocks), mode),
                                        resharded_blocks(len(blocks), reshard, mode)):
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=again if on else False, **extra)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False, **extra)
    if prefetch == "explicit":
        explicit_prefetch([block for _, block in blocks])


def explicit_prefetch(blocks: list[Any]) -> None:
    """FSDP2 explicit prefetching, as torchtitan's apply_fsdp sets it under EP (where a
    device-to-host sync would stall the implicit kind): each block issues the next block's
    all-gather in its pre-forward and the previous block's in its pre-backward."""
    for earlier, later in zip(blocks, blocks[1:]):
        earlier.set_modules_to_forward_prefetch([later])
        later.set_modules_to_backward_prefetch([earlier])
