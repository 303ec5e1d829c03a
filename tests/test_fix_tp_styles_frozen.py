"""sequence_parallel_frozen on styles that do and do not keep requires_grad.

A stand-in `style` module holds classes whose methods re-create a module's parameters
the way torch's TP styles do (the unfixed ones with nn.Parameter's default
requires_grad=True, the fixed one passing requires_grad): the fix must wrap exactly the
unfixed ones, keep frozen parameters frozen through them, and be idempotent.
"""

from __future__ import annotations

import sys
import types

import pytest

from distci.provision.selfwheels import REPO

sys.path.insert(0, str(REPO / "fixes"))  # as tests/test_fixes.py: installed or not
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from distci_fixes.fixes import sequence_parallel_frozen as fix  # noqa: E402
from distci_fixes.patching import patched_by  # noqa: E402


class SequenceParallel:
    def _replicate_module_fn(self, name, module, device_mesh):
        for p_name, p in list(module.named_parameters()):
            module.register_parameter(p_name, nn.Parameter(p.detach().clone()))


class ColwiseParallel:  # as before pytorch PR 171709
    def _partition_linear_fn(self, name, module, device_mesh):
        for p_name, p in list(module.named_parameters()):
            module.register_parameter(p_name, nn.Parameter(p.detach().clone()))


class RowwiseParallel:  # as after it
    def _partition_linear_fn(self, name, module, device_mesh):
        for p_name, p in list(module.named_parameters()):
            module.register_parameter(p_name, nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))


def _style():
    style = types.ModuleType("style")
    for cls in (SequenceParallel, ColwiseParallel, RowwiseParallel):
        setattr(style, cls.__name__, type(cls.__name__, (), dict(vars(cls))))
    return style


def test_only_the_styles_that_lose_the_flag_are_wrapped_and_frozen_stays_frozen():
    style = _style()
    assert fix.detect(style)
    assert fix._affected(style) == [("SequenceParallel", "_replicate_module_fn"),
                                    ("ColwiseParallel", "_partition_linear_fn")]
    fix.apply(style)
    fix.apply(style)  # idempotent
    assert patched_by(style.SequenceParallel._replicate_module_fn) == fix.ID
    assert patched_by(style.ColwiseParallel._partition_linear_fn) == fix.ID
    assert patched_by(style.RowwiseParallel._partition_linear_fn) != fix.ID
    assert not fix.detect(style)
    for owner, method in [(style.SequenceParallel, "_replicate_module_fn"),
                          (style.ColwiseParallel, "_partition_linear_fn")]:
        module = nn.Linear(4, 4).requires_grad_(False)
        getattr(owner(), method)("", module, None)
        assert not any(p.requires_grad for p in module.parameters()), owner.__name__
        trained = nn.Linear(4, 4)
        getattr(owner(), method)("", trained, None)
        assert all(p.requires_grad for p in trained.parameters()), owner.__name__


def test_unfixed_styles_do_unfreeze():  # the stand-ins really show the bug
    module = nn.Linear(4, 4).requires_grad_(False)
    _style().ColwiseParallel()._partition_linear_fn("", module, None)
    assert all(p.requires_grad for p in module.parameters())


def test_a_torch_without_sequence_parallels_method_is_a_missing_target():
    from distci_fixes.patching import TargetMissing

    style = _style()
    del style.SequenceParallel._replicate_module_fn
    with pytest.raises(TargetMissing):
        fix.detect(style)
