"""torchtitan#3869: torchtitan's async TP never enables symmetric memory for the TP group,
so inductor's micro-pipeline TP pass fuses nothing (silent: async TP runs as plain TP).

torch deprecated `enable_symm_mem_for_group` ("There is no need to call this function
anymore"), and torchtitan 0.2.x's `maybe_enable_async_tp(job_config, tp_mesh)` only sets
`torch._inductor.config._micro_pipeline_tp`. But the pass still asks
`is_symm_mem_enabled_for_group(group)`, which is true only for groups registered by that
deprecated call (torch 2.10 to 2.14.1 at least), and skips every all-gather and
reduce-scatter otherwise. Found by distci on 2xH200 (torch 2.11, torchtitan 0.2.2): 0
fused ops in every torchtitan async-TP case. torchtitan fixed it upstream by calling the
deprecated API again (torchtitan PR 4045, after 0.2.2).

The fix wraps `maybe_enable_async_tp`: when the job enables async TP it registers the TP
group with `enable_symm_mem_for_group` (its deprecation warning silenced), as torchtitan's
upstream fix does. The wrap happens when torchtitan.distributed.tensor_parallel is first
imported, before the model files bind the name.

detect(): torchtitan's function takes `tp_mesh` and never calls enable_symm_mem_for_group,
while torch's `is_symm_mem_enabled_for_group` still consults the registry that call fills.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from types import ModuleType
from typing import Any, Callable

from distci_fixes.model import Applies, Fix
from distci_fixes.patching import TargetMissing, function_of, lookup, patched_by, source_of, wrap

ID = "torchtitan_asynctp_symm_mem"
FUNCTION = "maybe_enable_async_tp"


def _async_tp_requested(job_config: Any) -> bool:
    parallelism = getattr(job_config, "parallelism", None)
    return bool(getattr(parallelism, "enable_async_tensor_parallel", False))


def _registering(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)  # keeps the signature visible (inspect follows __wrapped__)
    def maybe_enable_async_tp(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)  # raises, as upstream does, when compile is off
        arg = signature.bind(*args, **kwargs).arguments
        if _async_tp_requested(arg.get("job_config")) and arg.get("tp_mesh") is not None:
            from torch.distributed import _symmetric_memory as symm_mem

            group_name = arg["tp_mesh"].get_group().group_name
            if not symm_mem.is_symm_mem_enabled_for_group(group_name):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    symm_mem.enable_symm_mem_for_group(group_name)
        return result

    return maybe_enable_async_tp


def _torch_gates_on_registration() -> bool:
    try:
        from torch.distributed import _symmetric_memory as symm_mem
    except ImportError:
        return False
    gate = getattr(symm_mem, "is_symm_mem_enabled_for_group", None)
    try:
        return gate is not None and "_group_name_to_store" in source_of(gate)
    except TargetMissing:
        return False


def detect(module: ModuleType) -> bool:
    target = lookup(module, FUNCTION)
    if patched_by(target) == ID:
        return False
    function = function_of(target)
    if "tp_mesh" not in inspect.signature(function).parameters:
        return False
    return "enable_symm_mem_for_group" not in source_of(target) and _torch_gates_on_registration()


def apply(module: ModuleType) -> None:
    wrap(module, FUNCTION, _registering, ID)


FIX = Fix(
    id=ID,
    title="torchtitan async TP never enables symmetric memory for the TP group: nothing fuses",
    upstream=(
        "https://github.com/pytorch/torchtitan/pull/3869",
        "https://github.com/pytorch/torchtitan/pull/4045",
    ),
    applies=Applies(releases=">=2.6"),
    target="torchtitan.distributed.tensor_parallel",
    detect=detect,
    apply=apply,
    test="suites/regressions/test_torchtitan3869_asynctp_symm_mem.py",
)
