"""TP styles make frozen parameters trainable again (silent).

`SequenceParallel._replicate_module_fn` replaces every parameter of the norm it
parallelizes with `nn.Parameter(DTensor.from_local(param, ...))`, and nn.Parameter's
default is requires_grad=True: a norm frozen before `parallelize_module` (LoRA-style
fine-tuning freezes everything but the adapters) comes out trainable, gets gradients,
and an optimizer built over `requires_grad` parameters updates it. pytorch PR 171709
(issue 171523) fixed the same loss in ColwiseParallel, RowwiseParallel and
distribute_module, not in SequenceParallel; torch 2.13.0 and 2.14.1 still have it. On
torch releases from before that PR (the fix audit: 2.5.1 to 2.7.0) Colwise/Rowwise lose
the flag too.

The fix wraps each style method that re-creates parameters without passing
requires_grad (SequenceParallel's, and Colwise/Rowwise's partition functions where this
torch predates PR 171709): it records each parameter's requires_grad before the
original runs and restores it on the replacement. detect(): the bug is present while
one of those methods' source creates the Parameter without passing requires_grad.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from distci_fixes.model import Applies, Fix
from distci_fixes.patching import lookup, patched_by, source_of, wrap

ID = "sequence_parallel_frozen"


def _keeping_requires_grad(original: Callable[..., Any]) -> Callable[..., Any]:
    def keeping(self: Any, name: str, module: Any, device_mesh: Any) -> Any:
        frozen = {p_name for p_name, p in module.named_parameters() if not p.requires_grad}
        out = original(self, name, module, device_mesh)
        for p_name, p in module.named_parameters():
            if p_name in frozen:
                p.requires_grad_(False)
        return out

    keeping.__name__ = keeping.__qualname__ = original.__name__
    return keeping


TARGETS = (
    ("SequenceParallel", "_replicate_module_fn"),
    ("ColwiseParallel", "_partition_linear_fn"),
    ("ColwiseParallel", "_partition_embedding_fn"),
    ("RowwiseParallel", "_partition_linear_fn"),
    ("RowwiseParallel", "_partition_embedding_fn"),
)
"""Style methods that replace a module's parameters (all take (self, name, module, mesh))."""


def _affected(style: ModuleType) -> list[tuple[str, str]]:
    """The targets whose source re-creates parameters without requires_grad (not yet patched).

    SequenceParallel's must exist (a missing one is a target gone: `broken`); the others
    are looked at where this torch has them."""
    lookup(style, "SequenceParallel._replicate_module_fn")
    found = []
    for owner, name in TARGETS:
        cls = getattr(style, owner, None)
        if cls is None or name not in vars(cls):
            continue
        target = getattr(cls, name)
        if patched_by(target) != ID and "requires_grad" not in source_of(target):
            found.append((owner, name))
    return found


def detect(style: ModuleType) -> bool:
    return bool(_affected(style))


def apply(style: ModuleType) -> None:
    for owner, name in _affected(style):
        wrap(getattr(style, owner), name, _keeping_requires_grad, ID)


FIX = Fix(
    id=ID,
    title="TP styles re-create parameters with requires_grad=True (frozen weights train): SequenceParallel; Colwise/RowwiseParallel before pytorch PR 171709",
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
