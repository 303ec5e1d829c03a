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

detect() is version-aware on both sides, so a stack that already carries the fix reads
`not_needed`, never `broken`:
- torch: the bug needs a gate that consults the registry only the deprecated call fills
  (`_group_name_to_store`, torch 2.10 .. 2.14.1). torch 2.15.0's gate asks instead
  whether the current accelerator has a symmetric-memory backend: nothing to register.
- torchtitan: 0.2.x enables async TP in `tensor_parallel.maybe_enable_async_tp(job_config,
  tp_mesh)`; 0.3.x moved it to `compile._maybe_enable_async_tp(compile_config, tp_mesh)`,
  which calls `enable_symm_mem_for_group` itself (upstream's fix). A moved function that
  does not register the group is the bug with its patch target gone: TargetMissing
  (`broken`), naming torchtitan and where the function went. The moved module is read from
  its source file, not imported: detect() runs inside an import hook.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import sys
import warnings
from types import ModuleType
from typing import Any, Callable

from distci_fixes.model import Applies, Fix
from distci_fixes.patching import TargetMissing, function_of, lookup, package_version, patched_by, source_of, wrap

ID = "torchtitan_asynctp_symm_mem"
FUNCTION = "maybe_enable_async_tp"
MOVED_TO = ("torchtitan.distributed.compile", "_maybe_enable_async_tp")
"""Where torchtitan 0.3.x enables async TP (it registers the group there itself)."""
REGISTERS = "enable_symm_mem_for_group"


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


def _function_source(module_name: str, function: str) -> str | None:
    """The source of `module_name.function` (None: no such function), without importing it."""
    module = sys.modules.get(module_name)
    if module is not None:
        try:
            return source_of(lookup(module, function))
        except TargetMissing:
            return None
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as handle:
        text = handle.read()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return ast.get_source_segment(text, node)
    return None


def detect(module: ModuleType) -> bool:
    if not _torch_gates_on_registration():
        return False  # torch 2.15+: the pass no longer needs the registration (or no pass)
    try:
        target = lookup(module, FUNCTION)
    except TargetMissing:
        moved = _function_source(*MOVED_TO)
        if moved is None:
            raise TargetMissing(f"{module.__name__}.{FUNCTION} does not exist in {package_version(module.__name__)}, "
                                f"nor {'.'.join(MOVED_TO)}: cannot tell where it enables async TP") from None
        if REGISTERS in moved:
            return False  # torchtitan 0.3.x: the moved function carries upstream's fix
        raise TargetMissing(f"{package_version(module.__name__)} moved {FUNCTION} to {'.'.join(MOVED_TO)}, which "
                            f"does not call {REGISTERS}; this fix patches {module.__name__}.{FUNCTION} only") from None
    if patched_by(target) == ID:
        return False
    function = function_of(target)
    if "tp_mesh" not in inspect.signature(function).parameters:
        return False
    return REGISTERS not in source_of(target)


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
