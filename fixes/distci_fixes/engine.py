"""Decide, arm, apply and record every fix in this process.

This is the one piece of process-wide state in the fix package, and it has to be: the
patches themselves are process-wide. Each fix goes through the same steps:

    selected by DISTCI_FIXES?  -> no: disabled
    build in its range?        -> no: out_of_range   (None: detect() decides)
    wait for its target module -> pending
    detect(module)             -> False: not_needed
    apply(module); detect()    -> still present: broken; else applied

and any exception on the way (a vanished target, a third party's bug) is recorded as
`broken`; nothing here ever raises into the importing program.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Dict, Iterable, List, Optional

from distci_fixes import hooks
from distci_fixes.build import Decision, TorchBuild, decide
from distci_fixes.model import (
    APPLIED,
    BROKEN,
    DISABLED,
    NOT_NEEDED,
    OUT_OF_RANGE,
    PENDING,
    Fix,
    FixRecord,
)
from distci_fixes.registry import LoadError, discover
from distci_fixes.selection import Selection


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _installed(package: str) -> bool:
    if package in sys.modules:
        return True
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return True  # present but odd (no spec): let the import itself report


class Engine:
    def __init__(self, fixes: Optional[List[Fix]] = None) -> None:
        """`fixes` None: discover them (registry); a list: exactly these (tests, tools)."""
        self._lock = threading.RLock()
        self._fixes: Optional[List[Fix]] = list(fixes) if fixes is not None else None
        self._load_errors: List[LoadError] = []
        self._records: Dict[str, FixRecord] = {}
        self.selection: Optional[Selection] = None
        self.build: Optional[TorchBuild] = None

    def fixes(self) -> List[Fix]:
        with self._lock:
            if self._fixes is None:
                self._fixes, self._load_errors = discover()
            return list(self._fixes)

    def _record(self, fix: Fix, status: str, reason: str, **kw: object) -> FixRecord:
        record = FixRecord(
            id=fix.id,
            status=status,
            reason=reason,
            origin=fix.origin,
            target=fix.target,
            test=fix.test,
            upstream=tuple(fix.upstream),
            **kw,  # type: ignore[arg-type]
        )
        self._records[fix.id] = record
        return record

    def arm(self, selection: Selection, build: TorchBuild, eager: bool) -> None:
        """Decide every fix not yet applied; apply now (eager) or when its target loads."""
        with self._lock:
            self.selection, self.build = selection, build
            for fix in self.fixes():
                previous = self._records.get(fix.id)
                if previous is not None and previous.status == APPLIED:
                    continue
                if not selection.allows(fix.id):
                    self._record(fix, DISABLED, f"DISTCI_FIXES={selection.text}")
                    continue
                try:
                    decision = decide(fix.applies, build)
                except Exception as err:
                    self._record(fix, BROKEN, f"range check failed: {_describe(err)}")
                    continue
                if decision.in_range is False:
                    self._record(fix, OUT_OF_RANGE, decision.reason, in_range=False)
                    continue
                self._record(fix, PENDING, f"waiting for {fix.target}; {decision.reason}",
                             in_range=decision.in_range)
                if eager:
                    self._settle_now(fix, decision)
                else:
                    hooks.when_imported(
                        fix.target, lambda module, f=fix, d=decision: self._settle(f, module, d)
                    )

    def _settle_now(self, fix: Fix, decision: Decision) -> None:
        package = fix.target.split(".")[0]
        if not _installed(package):
            # A fix for a third-party package (torchtitan, torchao) in a stack without it:
            # nothing to patch here. A vanished module inside an installed one stays broken.
            self._record(fix, NOT_NEEDED, f"{package} is not installed; {decision.reason}",
                         present=False, in_range=decision.in_range)
            return
        try:
            module = importlib.import_module(fix.target)
        except Exception as err:
            self._record(fix, BROKEN, f"target module {fix.target} did not import: {_describe(err)}",
                         in_range=decision.in_range)
            return
        self._settle(fix, module, decision)

    def _settle(self, fix: Fix, module: ModuleType, decision: Decision) -> None:
        with self._lock:
            current = self._records.get(fix.id)
            if current is None or current.status != PENDING:
                return
            try:
                present = bool(fix.detect(module))
            except Exception as err:
                self._record(fix, BROKEN, f"detect() failed: {_describe(err)}",
                             in_range=decision.in_range)
                return
            if not present:
                self._record(fix, NOT_NEEDED, f"detect(): bug absent; {decision.reason}",
                             present=False, in_range=decision.in_range)
                return
            try:
                fix.apply(module)
                still = bool(fix.detect(module))
            except Exception as err:
                self._record(fix, BROKEN, f"apply() failed: {_describe(err)}",
                             present=True, in_range=decision.in_range)
                return
            if still:
                self._record(fix, BROKEN, "apply() ran but detect() still finds the bug",
                             present=True, in_range=decision.in_range)
                return
            self._record(fix, APPLIED, decision.reason, present=True, in_range=decision.in_range)

    def settle_pending(self) -> None:
        """Import the targets of pending fixes so that each reaches a final status."""
        with self._lock:
            pending = [f for f in self.fixes() if self._records.get(f.id) and
                       self._records[f.id].status == PENDING]
            for fix in pending:
                assert self.build is not None
                self._settle_now(fix, decide(fix.applies, self.build))

    def records(self) -> List[FixRecord]:
        with self._lock:
            self.fixes()
            out = [self._records[f.id] for f in self.fixes() if f.id in self._records]
            out += [
                FixRecord(id=e.name, status=BROKEN, reason=f"entry point failed to load: {e.reason}",
                          origin=e.origin)
                for e in self._load_errors
            ]
            return out

    def detect_all(self, ids: Optional[Iterable[str]] = None) -> Dict[str, Optional[bool]]:
        """detect() of every fix (or of `ids`) without applying anything (None: failed).

        The audit uses this to say whether each bug is present in a stack, in range or not.
        It imports each fix's target module.
        """
        wanted = set(ids) if ids is not None else None
        found: Dict[str, Optional[bool]] = {}
        for fix in self.fixes():
            if wanted is not None and fix.id not in wanted:
                continue
            try:
                found[fix.id] = bool(fix.detect(importlib.import_module(fix.target)))
            except Exception:
                found[fix.id] = None
        return found


ENGINE = Engine()
