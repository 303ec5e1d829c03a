"""The records of the fix package: what a fix declares, and what became of it.

A fix is data (DESIGN.md rule 5): an id, where it applies, how to tell whether the bug is
in this process, how to patch it, and the regression test that proves both. Keeping it
declarative is what lets the audit run every fix the same way, ours and other packages'.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any, Callable, Optional, Tuple

# What became of a fix in this process.
APPLIED = "applied"  # the bug was present and the patch is in place
NOT_NEEDED = "not_needed"  # in range, but detect() finds the bug absent here
OUT_OF_RANGE = "out_of_range"  # this torch build is outside the declared range
DISABLED = "disabled"  # DISTCI_FIXES (or apply(only=...)) left it out
BROKEN = "broken"  # the patch target vanished or the patch did not take
PENDING = "pending"  # armed: applied when its target module is first imported
STATUSES = (APPLIED, NOT_NEEDED, OUT_OF_RANGE, DISABLED, BROKEN, PENDING)


@dataclass(frozen=True)
class Applies:
    """Where a fix applies, for every kind of torch build.

    `releases` is a PEP 440 specifier over release versions (local labels such as
    `+cu124` ignored), e.g. ">=2.6,<2.8". PEP 440 orders `2.8.0.dev20250301` and
    `2.8.0a0+git1a2b3c4` before 2.8.0 but cannot place them relative to the upstream fix,
    so a nightly is placed by its date (`nightly_from` inclusive, `nightly_until`
    exclusive, both "YYYY-MM-DD") and a source build by its commit: a build at one of
    `fixed_commits` (the fix's merge commit and its cherry-picks) is out of range. What
    none of these can decide is left to the fix's detect().
    """

    releases: str
    nightly_from: Optional[str] = None
    nightly_until: Optional[str] = None
    fixed_commits: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        from packaging.specifiers import SpecifierSet

        SpecifierSet(self.releases)  # fail at definition time, not in a user's import
        for bound in (self.nightly_from, self.nightly_until):
            if bound is not None and not _is_iso_date(bound):
                raise ValueError(f"nightly bound {bound!r} is not a YYYY-MM-DD date")


def _is_iso_date(text: str) -> bool:
    parts = text.split("-")
    return len(parts) == 3 and all(p.isdigit() for p in parts) and len(parts[0]) == 4


@dataclass(frozen=True)
class Fix:
    """One fix. `detect` and `apply` receive the imported target module.

    detect(module) -> bool: is the bug present in this process? It must take < 50 ms and
    run no compile and no collective (it reads source or attributes of the patch target),
    because it runs in every process at import time.
    apply(module): patch it; must be idempotent. Raising TargetMissing (or anything
    else) records the fix as `broken`; it never escapes into the user's program.
    `test` is the regression test (a pytest node id relative to the repository root)
    that fails with the fix off on an affected stack and passes with it on.
    """

    id: str
    title: str
    upstream: Tuple[str, ...]
    applies: Applies
    target: str
    detect: Callable[[ModuleType], bool]
    apply: Callable[[ModuleType], None]
    test: str
    origin: str = "distci-fixes"

    def __post_init__(self) -> None:
        if not self.id.isidentifier():
            raise ValueError(f"fix id {self.id!r} must be a Python identifier")


@dataclass
class FixRecord:
    """What became of one fix in this process, as report() returns it (one dict each)."""

    id: str
    status: str
    reason: str
    present: Optional[bool] = None
    in_range: Optional[bool] = None
    origin: str = ""
    target: str = ""
    test: str = ""
    upstream: Tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["upstream"] = list(self.upstream)
        return record
