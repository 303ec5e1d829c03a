"""distci-fixes: version-gated, self-proving fixes for upstream PyTorch bugs.

Every process that imports torch runs `_autoload.autoload` through torch's
`torch.backends` entry-point group; it arms the fixes DISTCI_FIXES selects, each one
patching its target when that module is first imported. `apply()` does the same at
once, for processes where autoloading is off. `report()` says what became of each fix,
for the stack a cell records.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Union

from distci_fixes.build import TorchBuild, decide
from distci_fixes.model import STATUSES, Applies, Fix, FixRecord
from distci_fixes.patching import TargetMissing
from distci_fixes.selection import ENV, Selection, UnknownFixError

__all__ = [
    "ENV", "STATUSES", "Applies", "Fix", "FixRecord", "Selection", "TargetMissing",
    "TorchBuild", "UnknownFixError", "all_fixes", "apply", "check_env", "decide", "detect_all", "report",
]


def _engine() -> Any:
    from distci_fixes.engine import ENGINE

    return ENGINE


def all_fixes() -> List[Fix]:
    """Every registered fix: ours and those of other packages' `distci.fixes` entry points."""
    return _engine().fixes()


def apply(only: Union[None, str, Iterable[str]] = None) -> List[Dict[str, Any]]:
    """Apply the selected fixes now (importing their targets) and return report().

    `only` is a DISTCI_FIXES-style string or a list of ids; None reads DISTCI_FIXES.
    Unknown ids are a caller's mistake and raise UnknownFixError (a ValueError). Idempotent.
    """
    engine = _engine()
    if only is None:
        selection = Selection.from_env()
    else:
        selection = Selection.parse(only if isinstance(only, str) else ",".join(only))
    selection.check(f.id for f in engine.fixes())
    engine.arm(selection, TorchBuild.current(), eager=True)
    return report()


def check_env() -> Selection:
    """DISTCI_FIXES as a Selection; UnknownFixError when it names an id no package registers.

    Controllers (the harness, distci's cell runs) call this before starting anything, so a
    typo is a configuration error there, before anything starts; `import torch` raises it too
    (as the cause of torch's "Failed to load the backend extension").
    """
    selection = Selection.from_env()
    selection.check(f.id for f in _engine().fixes())
    return selection


def report(settle: bool = True) -> List[Dict[str, Any]]:
    """One dict per fix: id, status, reason, present, in_range, origin, target, test, upstream.

    By default fixes still `pending` (armed, their target module not imported yet) have
    their targets imported first, so every status is final: that is what a stack capture
    records. settle=False reports the process as it is, without importing anything.
    """
    engine = _engine()
    if engine.selection is None:
        engine.arm(Selection.from_env(), TorchBuild.current(), eager=False)
    if settle:
        engine.settle_pending()
    return [r.to_dict() for r in engine.records()]


def detect_all(ids: Optional[Iterable[str]] = None) -> Dict[str, Optional[bool]]:
    """Whether each fix's (or each of `ids`') bug is present in this process, applying nothing."""
    return _engine().detect_all(ids)
