"""pytorch#142076: `isinstance(out, AsyncCollectiveTensor)` branches break under compile.

Code written for eager TP waits on the output of a RowwiseParallel layer with
`if isinstance(out, AsyncCollectiveTensor): out = out.wait()` (sglang did exactly
this). Under torch.compile, functional collectives must return plain tensors; they
decide with `_are_we_tracing()`, but during Dynamo's fake-tensor propagation
`is_torchdynamo_compiling()` is False, so Dynamo sees an ACT, takes the branch and
burns `.wait()` into the graph; AOTAutograd then calls it on a FunctionalTensor:
"'FunctionalTensor' object has no attribute 'wait'" (torch <= 2.5.1).

pytorch PR 142075 (torch 2.6.0) makes `_are_we_tracing()` also answer True while a
FakeTensorMode is active. This fix does the same by wrapping the function (it is looked
up as a module global at each call, so replacing the attribute is enough).

detect(): the bug is present while `_are_we_tracing` does not consult the FAKE
dispatch-mode key.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from distci_fixes.model import Applies, Fix
from distci_fixes.patching import function_of, lookup, patched_by, wrap

ID = "rowwise_parallel_wait"


def _tracing_or_faking(original: Callable[[], bool]) -> Callable[[], bool]:
    def _are_we_tracing() -> bool:
        if original():
            return True
        import torch

        return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None

    return _are_we_tracing


def detect(funcol: ModuleType) -> bool:
    target = lookup(funcol, "_are_we_tracing")
    if patched_by(target) == ID:
        return False
    return "FAKE" not in function_of(target).__code__.co_names


def apply(funcol: ModuleType) -> None:
    wrap(funcol, "_are_we_tracing", _tracing_or_faking, ID)


FIX = Fix(
    id=ID,
    title="Dynamo burns AsyncCollectiveTensor.wait() into the graph (FunctionalTensor has no wait)",
    upstream=(
        "https://github.com/pytorch/pytorch/issues/142076",
        "https://github.com/pytorch/pytorch/pull/142075",
    ),
    applies=Applies(releases="<2.6"),
    target="torch.distributed._functional_collectives",
    detect=detect,
    apply=apply,
    test="suites/regressions/test_pytorch142076_rowwise_parallel_wait.py",
)
