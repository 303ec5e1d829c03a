"""DISTCI_FIXES: which fixes this process may apply.

`all` (also when unset or empty), `none`, or a comma-separated list of fix ids. The
variable is read in every process at `import torch`, so a cell or a test switches fixes
off for its rank workers by setting it in their environment before torch is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import FrozenSet, Iterable, Optional

ENV = "DISTCI_FIXES"


class UnknownFixError(ValueError):
    """DISTCI_FIXES (or apply(only=...)) names a fix no installed package registers."""


@dataclass(frozen=True)
class Selection:
    """`ids` None means every fix; an empty set means none."""

    ids: Optional[FrozenSet[str]]
    text: str

    def allows(self, fix_id: str) -> bool:
        return self.ids is None or fix_id in self.ids

    def check(self, known: Iterable[str]) -> None:
        """Raise UnknownFixError naming the known ids when this selection names another one.

        A typo must not run a cell with no fix applied while its stack reads as if the fix
        were selected.
        """
        known = sorted(set(known))
        unknown = sorted((self.ids or frozenset()) - set(known))
        if unknown:
            raise UnknownFixError(f"{ENV}={self.text}: unknown fix id{'s' if len(unknown) > 1 else ''} "
                                  f"{', '.join(unknown)}; known ids: {', '.join(known)} (or all, none)")

    @classmethod
    def parse(cls, text: Optional[str]) -> "Selection":
        raw = (text or "").strip()
        if raw.lower() in ("", "all"):
            return cls(None, raw or "all")
        if raw.lower() == "none":
            return cls(frozenset(), raw)
        return cls(frozenset(p.strip() for p in raw.split(",") if p.strip()), raw)

    @classmethod
    def from_env(cls) -> "Selection":
        return cls.parse(os.environ.get(ENV))
