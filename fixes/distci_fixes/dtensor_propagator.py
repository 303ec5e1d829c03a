"""DTensor's sharding propagator as the strategy fixes reach it: one owner for finding it, for
telling whether an op already has a strategy, and for the version text their errors name."""

from __future__ import annotations

from typing import Any

from distci_fixes.patching import TargetMissing

REGISTRIES = ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules")
"""The sharding propagator's dicts keyed by OpOverload: an op in any of them has a strategy."""


def torch_version() -> str:
    import torch

    return f"torch {torch.__version__}"


def propagator() -> Any:
    """DTensor's ShardingPropagator with a callable `register_op_strategy` (TargetMissing where
    this torch lacks either: the fix is then `broken`, naming the version)."""
    # From _api: a fix runs while torch.distributed.tensor's __init__ is still importing _ops.
    from torch.distributed.tensor._api import DTensor

    try:
        found = DTensor._op_dispatcher.sharding_propagator
    except AttributeError:
        raise TargetMissing(f"DTensor._op_dispatcher.sharding_propagator does not exist in {torch_version()}") from None
    if not callable(getattr(found, "register_op_strategy", None)):
        raise TargetMissing(f"ShardingPropagator.register_op_strategy does not exist in {torch_version()}")
    return found


def registered(found: Any, op: Any) -> bool:
    """Whether `op` has an entry in any of the propagator's registries."""
    return any(op in getattr(found, name, {}) for name in REGISTRIES)


def strategy_helpers() -> tuple[Any, type, type, type]:
    """expand_to_full_mesh_op_strategy, RuntimeSchemaInfo, Replicate, Shard: upstream's helpers a
    strategy fix builds with (TargetMissing, so the fix is `broken`, where one vanished)."""
    try:
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
        from torch.distributed.tensor.placement_types import Replicate, Shard
    except ImportError as err:
        raise TargetMissing(f"DTensor's strategy helpers are gone in {torch_version()}: {err}") from None
    return expand_to_full_mesh_op_strategy, RuntimeSchemaInfo, Replicate, Shard
