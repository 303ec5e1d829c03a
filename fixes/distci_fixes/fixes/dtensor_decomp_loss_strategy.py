"""DTensor derives the fused pointwise losses' sharding from their decompositions, then runs the
fused kernel per shard: mean-reduced gradients come out multiplied by the number of shards.

`F.mse_loss`, `F.smooth_l1_loss`, `F.huber_loss`, `F.binary_cross_entropy`(`_with_logits`) and
`F.soft_margin_loss` (and their `*_backward` ops) have no registered DTensor strategy. torch
>= 2.13 derives one through `DecompShardingStrategy` (torch/distributed/tensor/_decompositions.py)
and then calls the fused ATen op on each local shard with the derived placements, so for
`reduction="mean"` the forward is a `Partial(avg)` of unequal shard means and the backward
divides by the local shard's `numel()` (suites/regressions/test_dtensor_decomp_loss_mean.py;
known issue dtensor-decomp-loss-mean-local-numel). Older torches raise "no sharding strategy".

The fix registers, through the sharding propagator's own `register_op_strategy`, a strategy
for each of these ops that is right whatever the reduction: every tensor argument and the
output Replicate (DTensor redistributes the inputs to it), and, for `reduction="none"` only
(an elementwise result), every tensor sharded alike on any dim. Correct first: a mean over
a sharded batch now all-gathers the prediction, as a user's own `.full_tensor()` would.

detect(): the bug is present while any of these ops has no entry in the propagator's
registries; a torch that registers strategies itself reads `not_needed`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, List

from distci_fixes.dtensor_propagator import propagator as _propagator
from distci_fixes.dtensor_propagator import registered as _registered
from distci_fixes.dtensor_propagator import strategy_helpers as _helpers
from distci_fixes.model import Applies, Fix
from distci_fixes.patching import MARKER

ID = "dtensor_decomp_loss_strategy"
LOSSES = ("mse_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
          "soft_margin_loss")
REDUCTION_NONE = 0


def _ops() -> List[Any]:
    """Each loss's forward and backward `.default` OpOverload that this aten has."""
    import torch

    found = []
    for name in LOSSES:
        for op_name in (name, f"{name}_backward"):
            packet = getattr(torch.ops.aten, op_name, None)
            if packet is not None and hasattr(packet, "default"):
                found.append(packet.default)
    return found


def _missing(propagator: Any) -> List[Any]:
    return [op for op in _ops() if not _registered(propagator, op)]


def _reduction(op_schema: Any) -> Any:
    """The `reduction` argument: the first int among the positional arguments after the tensors
    (mse/soft_margin: (.., reduction); smooth_l1/huber: (.., reduction, beta|delta); bce:
    (self, target, weight, reduction))."""
    for arg in op_schema.args_schema:
        if isinstance(arg, int) and not isinstance(arg, bool):
            return arg
    return op_schema.kwargs_schema.get("reduction", 1)


def _strategy(op_schema: Any) -> Any:
    expand, _, replicate, shard = _helpers()
    mesh = op_schema.get_mesh_from_args()
    tensors = len(op_schema.args_strategy)
    first = op_schema.args_strategy[0].strategies[0].output_spec
    options = [[replicate()] * (1 + tensors)]
    if _reduction(op_schema) == REDUCTION_NONE:
        options += [[shard(dim)] * (1 + tensors) for dim in range(len(first.shape))]
    return expand(mesh, op_schema, options, input_index=1)


setattr(_strategy, MARKER, ID)


def detect(ops_module: ModuleType) -> bool:
    return bool(_missing(_propagator()))


def apply(ops_module: ModuleType) -> None:
    propagator = _propagator()
    _, schema_info, _, _ = _helpers()
    for op in _missing(propagator):
        # Every argument from the first non-tensor one (reduction, beta/delta) is part of the
        # cached decision: a reduction="none" call may shard, a "mean" one may not.
        first_static = next(i for i, arg in enumerate(op._schema.arguments) if arg.type.kind() != "TensorType"
                            and "Tensor" not in str(arg.type))
        propagator.register_op_strategy(op, _strategy, schema_info(first_static))


FIX = Fix(
    id=ID,
    title="DTensor runs fused pointwise losses (mse, smooth_l1, huber, bce, soft_margin) per shard under a "
          "decomposition-derived strategy: mean-reduced gradients scaled by the number of shards",
    upstream=(),
    applies=Applies(releases=">=2.5"),
    target="torch.distributed.tensor._ops",
    detect=detect,
    apply=apply,
    test="suites/regressions/test_dtensor_decomp_loss_mean.py",
)
