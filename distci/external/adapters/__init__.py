"""Adapters: how one upstream project's tests become distci Cases and outcomes.

Each adapter module has `expand(suite, checkout, ctx) -> list[Case]` (the declared cases
plus what upstream declares itself) and `run(case, ctx) -> list[(test_id, Combined)]`
(one launch; a pytest file yields one outcome per testcase). Kept import-free, so the
in-environment halves of the adapters load without the controller's dependencies.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def adapter(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")
