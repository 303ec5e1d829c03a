"""FSDP2's custom gradient divide factor reduces with PREMUL_SUM, which gloo cannot run.

`FSDPModule.set_gradient_divide_factor(f)` (torchtitan sets it on MoE experts sharded over
a smaller mesh than the data-parallel one) makes `_get_gradient_divide_factors` pick
`ReduceOp.PREMUL_SUM(1 / f)` for fp32/bf16 gradients whatever the process group
supports; on gloo the first backward raises "Cannot use ReduceOp.PREMUL_SUM with Gloo"
(torch 2.13.0, suites/regressions/test_fsdp2_divide_factor_premul_sum.py). FSDP2 already
has the portable path: `force_sum_reduction_for_comms` (SUM, with the division done
before and after), which it forces for MTIA. This fix forces it too when the
reduce-scatter group runs on gloo over more than one rank; every other case keeps its op.

detect(): the bug is present while `_get_gradient_divide_factors` takes
`force_sum_reduction_for_comms` (the portable path exists) and nothing in it mentions gloo.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from distci_fixes.model import Applies, Fix
from distci_fixes.patching import function_of, lookup, patched_by, wrap

ID = "fsdp2_premul_sum_gloo"
TARGET = "_get_gradient_divide_factors"


def _on_gloo(group: Any) -> bool:
    if group is None:
        return False
    import torch.distributed as dist

    try:
        return "gloo" in str(dist.get_backend(group)).lower()
    except (RuntimeError, ValueError):
        return False


def _sum_on_gloo(original: Callable[..., Any]) -> Callable[..., Any]:
    import inspect

    signature = inspect.signature(original)

    def _get_gradient_divide_factors(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        group = bound.arguments.get("reduce_scatter_group")
        # Only where a PREMUL_SUM would cross the wire: a one-rank group reduces nothing, and
        # the forced path would divide its gradient twice (measured: ep_fsdp on 2 ranks, 0.5x).
        if _on_gloo(group) and group.size() > 1:
            bound.arguments["force_sum_reduction_for_comms"] = True
        return original(*bound.args, **bound.kwargs)

    return _get_gradient_divide_factors


def detect(collectives: ModuleType) -> bool:
    target = lookup(collectives, TARGET)
    if patched_by(target) == ID:
        return False
    code = function_of(target).__code__
    return "force_sum_reduction_for_comms" in code.co_varnames and "gloo" not in str(code.co_consts).lower()


def apply(collectives: ModuleType) -> None:
    wrap(collectives, TARGET, _sum_on_gloo, ID)


FIX = Fix(
    id=ID,
    title="FSDP2 set_gradient_divide_factor reduces with PREMUL_SUM, which gloo cannot run",
    upstream=(
        "https://github.com/pytorch/torchtitan/pull/2332",
        "https://github.com/ByteDance-Seed/VeOmni/issues/241",
    ),
    applies=Applies(releases=">=2.8"),
    target="torch.distributed.fsdp._fully_shard._fsdp_collectives",
    detect=detect,
    apply=apply,
    test="suites/regressions/test_fsdp2_divide_factor_premul_sum.py",
)
