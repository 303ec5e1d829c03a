"""pytorch#184980: an AsyncCollectiveTensor entering a compiled region breaks backward.

RowwiseParallel (like the other parallel styles) redistributes its Partial output with
`async_op=True`, so with `use_local_output=True` the module returns an
AsyncCollectiveTensor (ACT). When that ACT is the input of a torch.compile'd submodule
whose graph returns a view of it alongside compute, AOTAutograd guesses the tangent of
that output to be an ACT and the backward fails:
- torch 2.5: "We incorrectly attempted to compile the backward with incorrect subclass
  metadata" (AssertionError);
- torch 2.6 .. 2.11: "we encountered a tensor subclass where we guessed its metadata
  incorrectly" (RuntimeError in process_runtime_tangent);
- torch 2.13, 2.14: the compiled graph drops the ACT input's requires_grad, and the
  backward either fails with "'Tensor' object has no attribute '_local_tensor'" in
  Redistribute.backward or, with no parameter in the compiled region, has nothing to
  differentiate: the input's gradient is lost either way.

The fix makes RowwiseParallel wait for its output collective inside the Redistribute
autograd function (`async_op=False`), so the module returns a plain tensor with an
intact autograd graph. It deliberately does not call `.wait()` or `wait_tensor` on the
returned ACT: ACT.wait() returns the inner tensor, which is detached from autograd, and
the gradients of everything before the layer silently become None. The cost is the
eager overlap of that one collective with the next op; compiled graphs reorder the
wait anyway.

detect() reads RowwiseParallel._prepare_output_fn: the bug is present while it asks
for an async redistribute. It cannot see an upstream fix made on the AOTAutograd side;
the fix audit does (with the fix off, the regression test would pass).
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from distci_fixes.model import Applies, Fix
from distci_fixes.patching import function_of, lookup, patched_by, replace, source_of

ID = "act_tangent_coercion"
_ASYNC = re.compile(r"async_op\s*=\s*True")


def _sync_prepare_output_fn(output_layouts: Any, use_local_output: bool, mod: Any,
                            outputs: Any, device_mesh: Any) -> Any:
    if outputs.placements != output_layouts:
        outputs = outputs.redistribute(placements=output_layouts, async_op=False)
    return outputs.to_local() if use_local_output else outputs


def detect(style: ModuleType) -> bool:
    target = lookup(style, "RowwiseParallel._prepare_output_fn")
    if patched_by(target) == ID:
        return False
    try:
        return bool(_ASYNC.search(source_of(target)))
    except LookupError:
        code = function_of(target).__code__
        return "redistribute" in code.co_names and any(c is True for c in code.co_consts)


def apply(style: ModuleType) -> None:
    lookup(style, "RowwiseParallel._prepare_output_fn")
    replace(style.RowwiseParallel, "_prepare_output_fn", _sync_prepare_output_fn, ID)


FIX = Fix(
    id=ID,
    title="AsyncCollectiveTensor from RowwiseParallel into a compiled submodule breaks backward",
    upstream=("https://github.com/pytorch/pytorch/issues/184980",),
    applies=Applies(releases=">=2.5"),
    target="torch.distributed.tensor.parallel.style",
    detect=detect,
    apply=apply,
    test="suites/regressions/test_pytorch184980_act_tangent_coercion.py",
)
