"""What a rank template imports ahead of its tests, and the guard that keeps it forkable.

Every test runs in a fresh fork of its rank's template (template.py), so whatever the
template has imported, no test imports again: the selection's test modules (sent as the
Warm message before the first fork) and the torch and triton modules a test turned out to
import lazily (Dynamo, inductor's compile_fx and codegen, triton), learned from each test's
report. An import that starts the device's runtime (a CUDA context: some module calls
torch.cuda at import time) would leave the template unable to fork ranks that use the
device, so every import is followed by the device kind's `initialized()` probe; the first
one that flips it stops the warming, and the worker replaces its template (worker.py) with
a fresh one that leaves that module to the tests that import it.

Only library modules are learned from tests (`LEARNED_PREFIXES`): importing a torch module
is what the next test's own import would do, while a test's helper module may change its
process on import, which must stay inside that test's fork.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

LEARNED_PREFIXES = ("torch", "triton")
COMPILER = ("torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.codegen.wrapper",
            "torch._inductor.codegen.cpp", "torch._inductor.codegen.simd", "torch._inductor.codegen.triton",
            "triton")
"""Dynamo's and inductor's heavy lazy imports (seconds), imported ahead when the selection has a
test marked `compiles`; one that is missing (triton on a CPU build) is skipped."""
OPTIMIZER_IMPORTS = ("torch._dynamo",)
"""What building any torch optimizer imports lazily (Optimizer.__init__ runs under
torch._disable_dynamo, which imports Dynamo): nearly every test trains, so a template that
does not learn (on a device, worker.py) imports it ahead. Without it an eager one-GPU row spent
80 % of its time importing Dynamo in its fork (py-spy on an H100, 2026-12-06: 4.3 s a row
against 1.1 s with Dynamo in the template; reports/gpu/2026-12-06-1gpu-eager-fork-cost.md)."""
NOT_LEARNED = ("torch.testing",)  # torch's own test helpers change process state on import
BEFORE_ANY = "(before any import ahead)"  # `poisoned` when the device was initialized already
RECORD_ENV = "DISTCI_LEARNED_IMPORTS"
"""The file where a stack's templates remember what their tests taught them (compile_cache.py
puts it beside the stack's compile cache)."""
JOINING = ""  # the record's key for what joining a process group imports (no test module's)
MAX_REMEMBERED = 2000  # modules per test module: a record is a hint, never unbounded


@dataclass
class Warmed:
    """What `import_ahead` did: `imported` (in order), `failed` (module -> its error, left
    for its tests to report), and `poisoned`: the module whose import initialized the
    device; nothing after it was imported and the template must not fork again."""

    imported: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    poisoned: str | None = None


def import_ahead(modules: Iterable[str], initialized: Callable[[], bool], skip: Iterable[str] = ()) -> Warmed:
    """Imports `modules` in order, checking `initialized()` after each; stops at the first
    import that made it true. Modules in `skip` (found poisonous before) are left out."""
    done = Warmed()
    left_out = set(skip)
    if initialized():
        done.poisoned = BEFORE_ANY
        return done
    for name in modules:
        if name in sys.modules or name in left_out:
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a module it imports is missing: its tests will fail on that
                done.failed[name] = f"{type(exc).__name__}: {exc}"[:200]
            else:  # not installed here (triton on a CPU build): nothing to import
                continue
        except BaseException as exc:  # noqa: BLE001 - the tests that import it report it
            done.failed[name] = f"{type(exc).__name__}: {exc}"[:200]
        if initialized():
            done.poisoned = name
            return done
        if name not in done.failed:
            done.imported.append(name)
    return done


def newly_imported(before: frozenset[str]) -> list[str]:
    """The library modules (LEARNED_PREFIXES) imported since `before` was taken, for the
    template to import ahead of the next test, in the order the test imported them
    (sys.modules keeps it): the first usually imports the rest as the test's import did,
    where an alphabetical order imports a submodule before the package that breaks its
    import cycle ("cannot import name ... from partially initialized module", seen with
    inductor's codegen and kernel modules)."""
    found = []
    for name in list(sys.modules):
        if name in before or not name.startswith(LEARNED_PREFIXES) or name.startswith(NOT_LEARNED):
            continue
        if name.split(".")[0] in LEARNED_PREFIXES:
            found.append(name)
    return found


def remembered(record: Path | None, test_modules: Iterable[str]) -> list[str]:
    """The library modules earlier sessions' tests of `test_modules` (and joining a group)
    imported lazily, in the order they did: a template imports them with the test modules,
    so the first fork of a session no longer imports Dynamo and the template again after
    it. A missing or unreadable record is an empty one (it is only a hint)."""
    data = _read(record)
    found = dict.fromkeys(name for key in (JOINING, *test_modules) for name in data.get(key, []))
    return list(found)


def remember(record: Path | None, test_module: str, learned: Iterable[str]) -> None:
    """Adds what a test of `test_module` imported lazily to the record (merged, written whole
    by a rename: ranks and runs of one stack write it side by side; a lost update only costs
    the next session its first fork's imports)."""
    names = [n for n in learned if n.startswith(LEARNED_PREFIXES) and not n.startswith(NOT_LEARNED)]
    if record is None or not names:
        return
    data = _read(record)
    known = data.setdefault(test_module, [])
    seen = set(known)
    new = [n for n in dict.fromkeys(names) if n not in seen][:max(0, MAX_REMEMBERED - len(known))]
    if not new:  # known already: nothing to write
        return
    known += new
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=record.parent, prefix=record.name, suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(tmp, record)
    except OSError:  # a read-only or full disk: the session learns as before
        pass


def record_path() -> Path | None:
    """This process's record (RECORD_ENV), or None where the controller named none."""
    value = os.environ.get(RECORD_ENV)
    return Path(value) if value else None


def _read(record: Path | None) -> dict[str, list[str]]:
    if record is None:
        return {}
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: [n for n in v if isinstance(n, str)] for k, v in data.items() if isinstance(k, str) and isinstance(v, list)}
