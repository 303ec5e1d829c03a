"""Find the fixes: every object registered under the `distci.fixes` entry-point group.

distci-fixes registers its own fixes there too, so a team's patch package is found and
audited exactly like ours. An entry point may name a Fix, an iterable of Fix, or a
callable returning either. When distci_fixes runs from a source tree without being
installed, its built-in fixes are still found through BUILTIN.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Iterable, List, Tuple

from distci_fixes.model import Fix

GROUP = "distci.fixes"
BUILTIN = (
    "distci_fixes.fixes.act_tangent_coercion",
    "distci_fixes.fixes.rowwise_parallel_wait",
    "distci_fixes.fixes.float8_asynctp_ac_scale",
    "distci_fixes.fixes.asynctp_float8_sp_rows",
    "distci_fixes.fixes.torchtitan_asynctp_symm_mem",
    "distci_fixes.fixes.sequence_parallel_frozen",
    "distci_fixes.fixes.fsdp2_premul_sum_gloo",
    "distci_fixes.fixes.dtensor_sdpa_cpu_strategy",
    "distci_fixes.fixes.inductor_fx_cache_opaque_key",
    "distci_fixes.fixes.dtensor_decomp_loss_strategy",
)


@dataclass(frozen=True)
class LoadError:
    """An entry point that could not be loaded: reported as a `broken` fix."""

    name: str
    origin: str
    reason: str


def _as_fixes(obj: Any) -> List[Fix]:
    if callable(obj) and not isinstance(obj, Fix):
        obj = obj()
    if isinstance(obj, Fix):
        return [obj]
    fixes = list(obj)
    for item in fixes:
        if not isinstance(item, Fix):
            raise TypeError(f"{item!r} is not a distci_fixes.Fix")
    return fixes


def _entry_points() -> Iterable[Any]:
    from importlib.metadata import entry_points

    eps = entry_points()
    if hasattr(eps, "select"):
        return eps.select(group=GROUP)
    return eps.get(GROUP, ())  # Python 3.9


def discover() -> Tuple[List[Fix], List[LoadError]]:
    """All fixes, built-ins first, each id once (the first registration wins)."""
    fixes: List[Fix] = []
    errors: List[LoadError] = []
    seen = set()

    def add(found: Iterable[Fix]) -> None:
        for fix in found:
            if fix.id not in seen:
                seen.add(fix.id)
                fixes.append(fix)

    for name in BUILTIN:
        try:
            add([importlib.import_module(name).FIX])
        except Exception as err:
            errors.append(LoadError(name.rsplit(".", 1)[-1], "distci-fixes", f"{type(err).__name__}: {err}"))
            seen.add(name.rsplit(".", 1)[-1])
    for ep in _entry_points():
        dist = getattr(ep, "dist", None)
        origin = getattr(dist, "name", "") or ep.value.split(":")[0].split(".")[0]
        if ep.name in seen:
            continue
        try:
            found = _as_fixes(ep.load())
        except Exception as err:  # a third party's bug must not break import torch
            errors.append(LoadError(ep.name, origin, f"{type(err).__name__}: {err}"))
            continue
        if origin != "distci-fixes":
            found = [f if f.origin != "distci-fixes" else _with_origin(f, origin) for f in found]
        add(found)
    return fixes, errors


def _with_origin(fix: Fix, origin: str) -> Fix:
    from dataclasses import replace

    return replace(fix, origin=origin)
