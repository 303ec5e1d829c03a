"""The fix registry is declared in two places that must agree: the `distci.fixes` entry points
of fixes/pyproject.toml (how an installed distci-fixes is found, like any team's package)
and registry.BUILTIN (how a source tree that is not installed still finds its own fixes).
Every module under distci_fixes/fixes/ that defines FIX is in both, in the same order."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
FIXES = REPO / "fixes"
sys.path.insert(0, str(FIXES))

from distci_fixes.registry import BUILTIN  # noqa: E402


def _entry_point_modules() -> list[str]:
    project = tomllib.loads((FIXES / "pyproject.toml").read_text())["project"]
    values = project["entry-points"]["distci.fixes"].values()
    assert all(v.endswith(":FIX") for v in values), f"every entry point names a module's FIX: {list(values)}"
    return [v.split(":")[0] for v in values]


def _modules_defining_fix() -> set[str]:
    found = set()
    for path in (FIXES / "distci_fixes" / "fixes").glob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "FIX" for t in n.targets) for n in tree.body):
            found.add(f"distci_fixes.fixes.{path.stem}")
    return found


def test_builtin_and_entry_points_list_the_same_fixes_in_the_same_order() -> None:
    assert list(BUILTIN) == _entry_point_modules()


def test_every_fix_module_is_registered() -> None:
    assert _modules_defining_fix() == set(BUILTIN)
