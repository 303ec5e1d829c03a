"""matrix.toml's grammar as data: the keys a cell is declared with and the rules between them.

As the scenario table's COLUMNS / RULES (suites/scenario/columns.py): `KEYS` says, for every
key, where it may be written, how one value is checked, its built-in default, whether it is
an axis (it multiplies the cells and makes the id) and what an [[include]] does with it;
`RULES` says which combinations of a block's values mean nothing (never what is broken
upstream: that is the known-issues registry's job). distci/matrix.py runs one loop over
them. A new key is one `Key` row (and its Cell field).

A value check is a plain function `(value, key, declared) -> converted value` that raises
`Invalid(why)`; the loader adds the file:line and the block it was written in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from packaging.requirements import InvalidRequirement, Requirement

from distci.cells import Accelerator, Tier
from distci.errors import MatrixError
from distci.sources import PACKAGE_AXES, Source
from distci.tomlloc import suggest

KNOWN_ACCELERATORS = ("cpu", "cuda", "npu")
BACKENDS = ("gloo", "nccl", "hccl")
FIXES = ("on", "off")

# Bounds on counts, from what runners and GitHub allow: a count past them is a typo, and
# expanding it anyway (`shards = 1000000000`) would eat memory before anything complains.
MAX_JOBS = 256
"""GitHub Actions runs at most 256 jobs per matrix: a tier's cells x shards."""
MAX_WORLD_SIZE = 128
"""Ranks of one cell: the largest hosts hold 8-16 devices, and CPU ranks past this on one
runner measure the runner, not the stack."""
MAX_TIMEOUT_S = 6 * 3600
"""A job runs at most 6 hours on GitHub-hosted runners; a test's timeout cannot exceed it."""
LIMITS = {"world_size": MAX_WORLD_SIZE, "nodes": MAX_WORLD_SIZE, "timeout": MAX_TIMEOUT_S, "shards": MAX_JOBS}
"""The largest value of each count key."""

DEFAULTS, BLOCK, INCLUDE = "[defaults]", "[[matrix]]", "[[include]]"
"""The tables a cell key may be written in (an axis may also be matched by a rule)."""


class Invalid(ValueError):
    """One value a key does not allow; the message says why and what to write (the loader
    prefixes the block and names the file:line)."""


@dataclass
class Declared:
    """What a value check may look up: the file's accelerators and tiers, and the external
    suites' names (read once, when a cell first names one; None: not checked here)."""

    accelerators: dict[str, Accelerator] = field(default_factory=dict)
    tiers: dict[str, Tier] = field(default_factory=dict)
    external_names: Callable[[], Sequence[str]] | None = None
    _external: tuple[str, ...] | None = None

    def external(self) -> tuple[str, ...] | None:
        if self.external_names is None:
            return None
        if self._external is None:
            self._external = tuple(self.external_names())
        return self._external


Check = Callable[[Any, str, Declared], Any]

NO_DEFAULT = object()
"""The default of a key that has none built in (it must be written, or the cell goes without)."""


@dataclass(frozen=True)
class Key:
    """One key a cell is declared with: where it may be written, how a value is checked.

    An axis is list-valued (each value multiplies the cells of its block) and makes the id;
    an attribute is the same for every cell of its block. `check` checks one value (one
    element, for an axis) and returns it converted.
    """

    name: str
    check: Check
    tables: tuple[str, ...]
    help: str
    default: Any = NO_DEFAULT
    axis: bool = False
    include: str = ""
    """What an [[include]] does with the cells' value: "add" to the list, "set" it; "": not allowed."""


# ---- one value's checks

def strings(value: Any, key: str, declared: Declared | None = None, *, allow_empty: bool = True) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise Invalid(f"'{key}' must be a list of strings (got {value!r})")
    if not value and not allow_empty:
        raise Invalid(f"'{key}' is empty; give at least one value")
    return tuple(dict.fromkeys(value))


def nonempty(value: Any, key: str, declared: Declared | None = None) -> tuple[str, ...]:
    return strings(value, key, declared, allow_empty=False)


def _any(value: Any, key: str, declared: Declared) -> Any:
    return value


def _python(value: Any, key: str, declared: Declared) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid("'python' must be a string like \"3.11\"")
    return value


def _count(value: Any, key: str, declared: Declared) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Invalid(f"'{key}' must be a positive integer (got {value!r})")
    if key in LIMITS and value > LIMITS[key]:
        raise Invalid(f"'{key}' = {value} is past the most distci runs ({LIMITS[key]})")
    return value


def _fixes(value: Any, key: str, declared: Declared) -> str:
    if value not in FIXES:
        hint = f' (write "{"on" if value else "off"}")' if isinstance(value, bool) else ""
        raise Invalid(f"fixes = {value!r} must be \"on\" or \"off\"{hint}")
    return value


def _source(value: Any, key: str, declared: Declared) -> Source:
    try:
        return Source.parse(key, value)
    except MatrixError as exc:
        raise Invalid(str(exc)) from None


def _accelerator_name(value: Any, key: str, declared: Declared) -> str:
    if value not in declared.accelerators:
        raise Invalid(f"unknown accelerator '{value}'{suggest(str(value), declared.accelerators)}; "
                      f"declared: {', '.join(declared.accelerators)}")
    return value


def _tier_names(value: Any, key: str, declared: Declared) -> tuple[str, ...]:
    names = strings(value, "tiers")
    for name in names:
        if name not in declared.tiers:
            raise Invalid(f"unknown tier '{name}'{suggest(name, declared.tiers)}; declare "
                          f"[tiers.{name}] or use one of: {', '.join(declared.tiers) or 'none declared'}")
    return names


def _external(value: Any, key: str, declared: Declared) -> tuple[str, ...]:
    names = strings(value, "external")
    if not names:
        return names
    try:
        known = declared.external()
    except FileNotFoundError as exc:
        raise Invalid(f"'external' names suites of {exc.filename}, which does not exist; declare them there "
                      "or remove 'external'") from None
    for name in names if known is not None else ():
        if name not in known:
            hint = suggest(name, known) or f"; declared: {', '.join(known) or 'none'}"
            raise Invalid(f"unknown external suite '{name}'{hint}")
    return names


def _cell_id(value: Any, key: str, declared: Declared) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid(f"'{key}' must be a cell id (a string, e.g. \"cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on\"; "
                      "`nox -s matrix` lists them)")
    return value


def _requirements(value: Any, key: str, declared: Declared) -> tuple[str, ...]:
    lines = strings(value, "requirements")
    for line in lines:
        try:
            Requirement(line)
        except InvalidRequirement as exc:
            raise Invalid(f"requirements entry {line!r} is not a pip requirement ({str(exc).splitlines()[0]})") from None
    return lines


# fmt: off
KEYS: tuple[Key, ...] = (
    Key("accelerator", _accelerator_name, (BLOCK,), "a declared [accelerators.<name>]", axis=True),
    Key("arch", _any, (BLOCK,), "one of the accelerator's archs (default: its first)", axis=True),
    Key("variant", _any, (BLOCK,), "one of the accelerator's build variants (default: its first)", axis=True),
    *(Key(axis, _source, (BLOCK,) if axis == "torch_npu" else (DEFAULTS, BLOCK),
          f"where {axis} comes from (a package source)",
          default="none" if axis in ("torchao", "torchtitan") else NO_DEFAULT, axis=True) for axis in PACKAGE_AXES),
    Key("fixes", _fixes, (DEFAULTS, BLOCK), "distci-fixes applied (on) or not (off)", default="on", axis=True),
    Key("world_size", _count, (DEFAULTS, BLOCK), "ranks of the whole world", default=2, axis=True),
    Key("nodes", _count, (DEFAULTS, BLOCK), "hosts the world spans (distci.launch)", default=1, axis=True),
    Key("suites", nonempty, (DEFAULTS, BLOCK, INCLUDE), "suite paths under the repo", default=["suites"],
        include="add"),
    Key("tiers", _tier_names, (DEFAULTS, BLOCK, INCLUDE), "the tiers the cell runs in", default=[], include="add"),
    Key("python", _python, (DEFAULTS, BLOCK, INCLUDE), "the cell's Python version", default="3.11", include="set"),
    Key("timeout", _count, (DEFAULTS, BLOCK, INCLUDE), "seconds per test", default=300, include="set"),
    Key("external", _external, (DEFAULTS, BLOCK, INCLUDE), "names of [[suite]]s in suites/external.toml",
        default=[], include="add"),
    Key("requirements", _requirements, (DEFAULTS, BLOCK), "extra pip requirement lines installed with the stack",
        default=[]),
    Key("baseline", _cell_id, (BLOCK, INCLUDE),
        "the cell this one is judged against while a test has no history of its own here (e.g. a nightly or "
        "release-candidate cell against the release cell)", include="set"),
    Key("runner", nonempty, (INCLUDE,), "GitHub Actions `runs-on` labels (default: the accelerator's)",
        include="set"),
)
# fmt: on
KEY = {k.name: k for k in KEYS}
KEYS_ORDER = tuple(k.name for k in KEYS)
"""The order a block's keys are checked in: KEYS', so the first mistake reported is stable."""
AXES = tuple(k.name for k in KEYS if k.axis)
"""Product axes: what a cell's id is made of, and what [[exclude]] / [[include]] match on."""
BLOCK_KEYS = tuple(k.name for k in KEYS if BLOCK in k.tables)
DEFAULT_KEYS = tuple(k.name for k in KEYS if DEFAULTS in k.tables)
INCLUDE_KEYS = ("match", *(k.name for k in KEYS if INCLUDE in k.tables))
BUILTIN_DEFAULTS: dict[str, Any] = {k.name: k.default for k in KEYS if k.default is not NO_DEFAULT}
"""What a block starts from before [defaults] and its own keys."""
TOP_KEYS = ("schema", "defaults", "accelerators", "matrix", "exclude", "include", "tiers")
ACCELERATOR_KEYS = ("backend", "runner", "archs", "variants", "family", "description", "container")
ACCELERATOR_REQUIRED = ("backend", "runner", "archs", "variants")
TIER_KEYS = ("description", "blocking_suites", "shards")


@dataclass(frozen=True)
class Rule:
    """A combination of one block's checked values that means nothing on one of its
    accelerators: `broken` says why (after "[[matrix]] #N: ") and what to write, or returns
    nothing; `key` is the line the error names."""

    broken: Callable[[dict[str, Any], Accelerator], str | None]
    key: str | None


def _outside(values: Sequence[Any], allowed: Sequence[Any]) -> Any:
    return next((v for v in values if v not in allowed), None)


RULES: tuple[Rule, ...] = (
    Rule(lambda v, acc: "torch = 'none' is not allowed; every cell needs torch"
         if any(s.kind == "none" for s in v["torch"]) else None, "torch"),
    Rule(lambda v, acc: (bad := _outside(v.get("arch", ()), acc.archs)) is not None and
         f"arch '{bad}' is not in [accelerators.{acc.name}] archs ({', '.join(acc.archs)})", "arch"),
    Rule(lambda v, acc: (bad := _outside(v.get("variant", ()), acc.variants)) is not None and
         f"variant '{bad}' is not in [accelerators.{acc.name}] variants ({', '.join(acc.variants)}); "
         "put other accelerators in their own block", "variant"),
    Rule(lambda v, acc: 'an npu cell needs torch_npu (e.g. torch_npu = "~=2.13.0")'
         if acc.name == "npu" and "torch_npu" not in v else None, None),
    Rule(lambda v, acc: f"torch_npu is only for accelerator 'npu' (this block has '{acc.name}')"
         if acc.name != "npu" and "torch_npu" in v else None, "torch_npu"),
    Rule(lambda v, acc: next((f"world_size {ws} is not a multiple of nodes = {n} (every node runs the same number "
                              "of ranks); change world_size or nodes" for ws in v["world_size"] for n in v["nodes"]
                              if ws % n), None), "nodes"),
)
"""The rules between keys; a key's own values are checked by its Key."""
