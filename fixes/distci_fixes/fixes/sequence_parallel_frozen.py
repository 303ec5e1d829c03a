"""SequenceParallel makes frozen parameters trainable again (silent).

`SequenceParallel._replicate_module_fn` replaces every parameter of the norm it
parallelizes with `nn.Parameter(DTensor.from_local(param, ...))`, and nn.Parameter's
default is requires_grad=True: a norm frozen before `parallelize_module` (LoRA-style
fine-tuning freezes everything but the adapters) comes out trainable, gets gradients,
and an optimizer built over `requires_grad` parameters updates it. pytorch PR 171709
(issue 171523) fixed the same loss in ColwiseParallel, RowwiseParallel and
distribute_module, not in SequenceParallel; torch 2.13.0 and 2.14.1 still have it.

The fix wraps the method: it records each parameter's requires_grad before the original
runs and restores it on the replacement. detect(): the bug is present while the
method's source creates the Parameter without passing requires_grad.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from distci_fixes.model import Applies, Fix
from distci_fixes.patching import lookup, patched_by, source_of, wrap

ID = "sequence_parallel_frozen"


def _keeping_requires_grad(original: Callable[..., Any]) -> Callable[..., Any]:
    def _replicate_module_fn(self: Any, name: str, module: Any, device_mesh: Any) -> Any:
        frozen = {p_name for p_name, p in module.named_parameters() if not p.requires_grad}
        out = original(self, name, module, device_mesh)
        for p_name, p in module.named_parameters():
            if p_name in frozen:
                p.requires_grad_(False)
        return out

    return _replicate_module_fn


def detect(style: ModuleType) -> bool:
    target = lookup(style, "SequenceParallel._replicate_module_fn")
    if patched_by(target) == ID:
        return False
    return "requires_grad" not in source_of(target)


def apply(style: ModuleType) -> None:
    wrap(style.SequenceParallel, "_replicate_module_fn", _keeping_requires_grad, ID)


FIX = Fix(
    id=ID,
    title="SequenceParallel re-creates the norm's parameters with requires_grad=True (frozen weights train)",
    upstream=(
        "https://github.com/pytorch/pytorch/issues/171523",
        "https://github.com/pytorch/pytorch/pull/171709",
    ),
    applies=Applies(releases=">=2.5"),
    target="torch.distributed.tensor.parallel.style",
    detect=detect,
    apply=apply,
    test="suites/regressions/test_sequence_parallel_frozen.py",
)
