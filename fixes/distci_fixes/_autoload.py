"""The `torch.backends` entry point: torch calls autoload() near the end of `import torch`.

torch turns any exception raised here into a RuntimeError that aborts `import torch`
("Failed to load the backend extension: distci_fixes", with our error as its cause). So
only a configuration error raises: DISTCI_FIXES naming an id no package registers, which
must stop a run rather than run it as if the fix were selected (controllers check it
first; this is every other process: a torchrun rank, a user's script in a cell env).
Anything else becomes a warning and, where it concerns one fix, a `broken` record. It
imports no torch submodule; fixes wait for their targets.
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
        known = [f.id for f in ENGINE.fixes()]
    except Exception as err:  # never break `import torch` for our own failure
        warnings.warn(f"distci_fixes could not arm its fixes: {type(err).__name__}: {err}",
                      RuntimeWarning, stacklevel=2)
        return
    selection.check(known)  # UnknownFixError: the user's typo stops `import torch`, naming the known ids
    try:
        ENGINE.arm(selection, TorchBuild.current(), eager=False)
    except Exception as err:  # noqa: BLE001
        warnings.warn(f"distci_fixes could not arm its fixes: {type(err).__name__}: {err}",
                      RuntimeWarning, stacklevel=2)
