"""DTensor has no sharding strategy for sdpa's CPU flash kernel: 20-70 s of propagation per shape.

`F.scaled_dot_product_attention` on CPU DTensors dispatches to
`aten._scaled_dot_product_flash_attention_for_cpu` (and, in backward, its `_backward`).
DTensor registers strategies for the CUDA flash and efficient kernels
(torch/distributed/tensor/_ops/_matrix_ops.py) but none for the CPU one, so torch >= 2.13
falls to `DecompShardingStrategy`, which traces sdpa's whole decomposition through prims
refs once per candidate placement combination (125 traces of ~0.25 s on a 1-D mesh, far
more on 2-D): a TP attention on CPU stalls for most of a minute per new shape, and the
backward has no strategy at all ("no sharding strategy registered"). Older torches have no
decomposition path: both directions raise that NotImplementedError.
suites/regressions/test_dtensor_sdpa_sharding_propagation_time.py measures it.

The fix registers, through the sharding propagator's own `register_op_strategy`, the
strategies upstream gives the CUDA flash kernel, adapted to the CPU op's schema (outputs
(out, logsumexp); `attn_mask` and `scale` keyword arguments; backward
(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale) ->
(grad_q, grad_k, grad_v)): all-replicate, heads-sharded (dim 1) and batch-sharded (dim 0),
expanded over every mesh axis by upstream's `expand_to_full_mesh_op_strategy`. Any other
layout of q, k, v is redistributed to one of these, as for CUDA. A DTensor attn_mask follows
q on the dims it does not broadcast over (Replicate where it has size 1 or lacks the dim);
DTensor never redistributes keyword arguments, so only the strategies that take the mask as
it is laid out are offered, and a mask layout none takes raises, naming it.

detect(): the bug is present while the CPU flash forward or backward has no entry in any of
the propagator's registries (op strategies, single-dim strategies, rules); a torch whose
propagator registers one itself (or whose aten has no CPU flash op) reads `not_needed`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, List, Optional

from distci_fixes.dtensor_propagator import propagator as _propagator
from distci_fixes.dtensor_propagator import registered as _registered
from distci_fixes.dtensor_propagator import strategy_helpers as _upstream_helpers
from distci_fixes.model import Applies, Fix
from distci_fixes.patching import MARKER

ID = "dtensor_sdpa_cpu_strategy"
FORWARD = "_scaled_dot_product_flash_attention_for_cpu"
BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"


def _cpu_flash_ops() -> Optional[tuple[Any, Any]]:
    """The forward and backward OpOverloads, or None where this aten has no CPU flash kernel."""
    import torch

    try:
        return (getattr(torch.ops.aten, FORWARD).default, getattr(torch.ops.aten, BACKWARD).default)
    except (AttributeError, RuntimeError):
        return None


def _missing(propagator: Any) -> List[Any]:
    ops = _cpu_flash_ops()
    return [] if ops is None else [op for op in ops if not _registered(propagator, op)]


def _mask_placement(op_schema: Any, q_dim: int, shard: type, replicate: type) -> List[Any]:
    """The attn_mask's placement when q is sharded on `q_dim` (0 batch, 1 heads): [] when the
    mask is not a DTensor (nothing to place), else [Shard(d)] on the mask dim aligned with
    q_dim, or [Replicate()] where the mask broadcasts over it (size 1 or no such dim)."""
    from torch.distributed.tensor._op_schema import OpStrategy

    mask = op_schema.kwargs_schema.get("attn_mask")
    if not isinstance(mask, OpStrategy):
        return []
    shape = mask.strategies[0].output_spec.shape
    dim = q_dim - (4 - len(shape))
    if q_dim < 0 or dim < 0 or shape[dim] == 1:
        return [replicate()]
    return [shard(dim)]


def _placements(op_schema: Any, tensors: int, replicate: type, shard: type) -> List[List[Any]]:
    """One mesh axis's strategies: [outputs..., inputs..., (attn_mask)] for all-replicate,
    heads-sharded (dim 1, tensor parallel) and batch-sharded (dim 0, data parallel). Every
    tensor but the mask has batch and heads as dims 0 and 1 (logsumexp is (B, H, L))."""
    strategies = [[replicate()] * tensors + _mask_placement(op_schema, -1, shard, replicate)]
    for dim in (1, 0):
        strategies.append([shard(dim)] * tensors + _mask_placement(op_schema, dim, shard, replicate))
    return strategies


def _keeping_the_mask(op_schema: Any, strategy: Any) -> Any:
    """Only the specs that take a DTensor attn_mask as it is laid out: DTensor's dispatch never
    redistributes keyword arguments, so a spec that asks another layout of the mask would run
    the kernel on the wrong mask shard. A layout no spec takes (e.g. a mask sharded on the
    query's sequence) raises, naming it, instead of computing on the wrong shard."""
    from torch.distributed.tensor._op_schema import OpStrategy

    mask = op_schema.kwargs_schema.get("attn_mask")
    if not isinstance(mask, OpStrategy):
        return strategy
    current = mask.strategies[0].output_spec.placements
    kept = [spec for spec in strategy.strategies if spec.input_specs[-1].placements == current]
    if not kept:
        raise NotImplementedError(
            f"{ID}: sdpa on CPU takes a DTensor attn_mask laid out {current} under no strategy (DTensor does not "
            "redistribute keyword arguments): pass the mask Replicate, or sharded as q on its batch or heads dim")
    return OpStrategy(kept)


def _smallest_shard(size: int, ways: int) -> int:
    """The smallest piece of `size` split `ways` ways as DTensor's Shard splits (torch.chunk)."""
    chunk = -(-size // ways) if size else 0
    return max(0, size - chunk * (ways - 1))


def _no_empty_shard(mesh: Any, q_shape: Any, strategy: Any, q_index: int) -> Any:
    """Only the specs that leave every rank at least one batch row and one head of q, k, v.

    The CPU flash kernel dies with SIGFPE on zero heads or zero queries (torch 2.13.0 and
    2.15.0; plain sdpa never calls it on an empty input, its early return does), and
    DTensor's Shard leaves a rank empty even where the dim is not smaller than the mesh
    (5 heads over 4 ranks: 2, 2, 1, 0). Such a layout runs replicated on that axis instead."""
    from torch.distributed.tensor._op_schema import OpStrategy

    def keeps_every_rank(spec: Any) -> bool:
        smallest = {0: q_shape[0], 1: q_shape[1]}
        for axis, placement in enumerate(spec.input_specs[q_index].placements):
            dim = getattr(placement, "dim", None)
            if placement.is_shard() and dim in smallest:
                smallest[dim] = _smallest_shard(smallest[dim], mesh.size(axis))
        return all(smallest.values())

    return OpStrategy([spec for spec in strategy.strategies if keeps_every_rank(spec)])


def _q_shape(op_schema: Any, index: int) -> Any:
    return op_schema.args_schema[index].strategies[0].output_spec.shape


def _forward_strategy(op_schema: Any) -> Any:
    expand, _, replicate, shard = _upstream_helpers()
    mesh = op_schema.get_mesh_from_args()
    # [out, logsumexp, q, k, v, (attn_mask)]
    found = expand(mesh, op_schema, _placements(op_schema, 5, replicate, shard), input_index=2)
    return _keeping_the_mask(op_schema, _no_empty_shard(mesh, _q_shape(op_schema, 0), found, 0))


def _backward_strategy(op_schema: Any) -> Any:
    expand, _, replicate, shard = _upstream_helpers()
    try:
        mesh = op_schema.get_mesh_from_args(validate=False)
    except TypeError:  # torches whose get_mesh_from_args takes no `validate`
        mesh = op_schema.get_mesh_from_args()
    # [grad_q, grad_k, grad_v, grad_out, q, k, v, out, logsumexp, (attn_mask)]
    found = expand(mesh, op_schema, _placements(op_schema, 9, replicate, shard), input_index=3)
    return _keeping_the_mask(op_schema, _no_empty_shard(mesh, _q_shape(op_schema, 1), found, 1))


setattr(_forward_strategy, MARKER, ID)
setattr(_backward_strategy, MARKER, ID)


def detect(ops_module: ModuleType) -> bool:
    return bool(_missing(_propagator()))


def apply(ops_module: ModuleType) -> None:
    propagator = _propagator()
    _, schema_info, _, _ = _upstream_helpers()
    forward, backward = _cpu_flash_ops() or (None, None)
    missing = _missing(propagator)
    # dropout_p and is_causal (argument 3 on) do not change the placements, but hashing them
    # keeps one cached decision per call form, as upstream's CUDA strategies do.
    if forward in missing:
        propagator.register_op_strategy(forward, _forward_strategy, schema_info(3, static_kwargkey=["scale"]))
    if backward in missing:
        propagator.register_op_strategy(backward, _backward_strategy, schema_info(6, static_kwargkey=["scale"]))


FIX = Fix(
    id=ID,
    title="DTensor has no sharding strategy for sdpa's CPU flash kernel: minutes of decomposition "
          "propagation per shape (torch >= 2.13), no backward strategy at all",
    upstream=("https://github.com/pytorch/pytorch/issues/173988",),
    applies=Applies(releases=">=2.5"),
    target="torch.distributed.tensor._ops",
    detect=detect,
    apply=apply,
    test="suites/regressions/test_dtensor_sdpa_sharding_propagation_time.py",
)
