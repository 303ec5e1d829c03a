"""The `torch.backends` entry point: torch calls autoload() near the end of `import torch`.

torch turns any exception raised here into a RuntimeError that aborts `import torch`,
so this never raises: a problem becomes a warning and, where it concerns one fix, a
`broken` record. It imports no torch submodule; fixes wait for their targets.
"""

from __future__ import annotations

import warnings


def autoload() -> None:
    try:
        from distci_fixes.build import TorchBuild
        from distci_fixes.engine import ENGINE
        from distci_fixes.selection import Selection

        selection = Selection.from_env()
        if selection.ids is not None and not selection.ids:
            return  # `none`: report() records them as disabled when asked
        known = {f.id for f in ENGINE.fixes()}
        for unknown in sorted((selection.ids or frozenset()) - known):
            warnings.warn(f"DISTCI_FIXES names unknown fix {unknown!r}; known: {sorted(known)}",
                          RuntimeWarning, stacklevel=2)
        ENGINE.arm(selection, TorchBuild.current(), eager=False)
    except Exception as err:  # never break `import torch`
        warnings.warn(f"distci_fixes could not arm its fixes: {type(err).__name__}: {err}",
                      RuntimeWarning, stacklevel=2)
