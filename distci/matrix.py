"""Load and validate matrix.toml, expand it into Cells, and derive the CI matrix from it.

matrix.toml is the single source of truth for axes, cells, tiers and runner labels (the
schema is documented at the top of the file itself). Every mistake in it becomes one
`MatrixError` line that names the file, line, block and key, and says what to write
instead, because a CI matrix that silently drops a cell is worse than one that fails.

The grammar is data, as the scenario table's COLUMNS / RULES: `KEYS` says, for every key a
cell is declared with, where it may be written, how one value is checked, whether it is an
axis (it multiplies the cells and makes the id) and what an [[include]] does with it;
`RULES` says what keys must hold together. A new key is one `Key` row (and its Cell field).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from packaging.requirements import InvalidRequirement, Requirement

from distci.errors import MatrixError
from distci.tomlloc import Locator as _Locator, read as _read_toml, suggest as _suggest
from distci.external.spec import DEFAULT_PATH as EXTERNAL_PATH, load_suites
from distci.sources import PACKAGE_AXES, Source
from distci.cells import Accelerator, Cell, ContainerLimits, Matrix, Tier

SCHEMA = 1
# The checkout's external suites: the file cell runs read (distci.run.cellrun), so names are
# checked against what will run, wherever the matrix file itself lives.
EXTERNAL_SUITES = Path(__file__).resolve().parents[1] / EXTERNAL_PATH

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
MAX_MATRIX_BYTES = 1 << 20
"""A matrix is a few KB; a file past 1 MiB is the wrong file."""
LIMITS = {"world_size": MAX_WORLD_SIZE, "nodes": MAX_WORLD_SIZE, "timeout": MAX_TIMEOUT_S, "shards": MAX_JOBS}
"""The largest value of each count key."""

DEFAULTS, BLOCK, INCLUDE = "[defaults]", "[[matrix]]", "[[include]]"
"""The tables a cell key may be written in (an axis may also be matched by a rule)."""


@dataclass(frozen=True)
class Key:
    """One key a cell is declared with: where it may be written and how a value is checked.

    An axis is list-valued (each value multiplies the cells of its block) and makes the id;
    an attribute is the same for every cell of its block. `check` names the _Loader method
    that checks one value (one element, for an axis) and returns it converted.
    """

    name: str
    check: str
    tables: tuple[str, ...]
    axis: bool = False
    include: str = ""
    """What an [[include]] does with the cells' value: "add" to the list, "set" it; "": not allowed."""


# fmt: off
KEYS: tuple[Key, ...] = (
    Key("accelerator", "_accelerator_name", (BLOCK,), axis=True),
    Key("arch", "_any", (BLOCK,), axis=True),
    Key("variant", "_any", (BLOCK,), axis=True),
    *(Key(axis, "_source", (BLOCK,) if axis == "torch_npu" else (DEFAULTS, BLOCK), axis=True) for axis in PACKAGE_AXES),
    Key("fixes", "_fixes", (DEFAULTS, BLOCK), axis=True),
    Key("world_size", "_count", (DEFAULTS, BLOCK), axis=True),
    Key("nodes", "_count", (DEFAULTS, BLOCK), axis=True),  # hosts a cell's world spans (distci.launch)
    Key("suites", "_nonempty", (DEFAULTS, BLOCK, INCLUDE), include="add"),
    Key("tiers", "_tier_names", (DEFAULTS, BLOCK, INCLUDE), include="add"),
    Key("python", "_python", (DEFAULTS, BLOCK, INCLUDE), include="set"),
    Key("timeout", "_count", (DEFAULTS, BLOCK, INCLUDE), include="set"),
    Key("external", "_external", (DEFAULTS, BLOCK, INCLUDE), include="add"),
    Key("requirements", "_requirements", (DEFAULTS, BLOCK)),
    Key("runner", "_nonempty", (INCLUDE,), include="set"),
)
# fmt: on
KEY = {k.name: k for k in KEYS}
AXES = tuple(k.name for k in KEYS if k.axis)
"""Product axes: what a cell's id is made of, and what [[exclude]] / [[include]] match on."""
BLOCK_KEYS = tuple(k.name for k in KEYS if BLOCK in k.tables)
DEFAULT_KEYS = tuple(k.name for k in KEYS if DEFAULTS in k.tables)
INCLUDE_KEYS = ("match", *(k.name for k in KEYS if INCLUDE in k.tables))
TOP_KEYS = ("schema", "defaults", "accelerators", "matrix", "exclude", "include", "tiers")
ACCELERATOR_KEYS = ("backend", "runner", "archs", "variants", "family", "description", "container")
ACCELERATOR_REQUIRED = ("backend", "runner", "archs", "variants")
TIER_KEYS = ("description", "blocking_suites", "shards")


@dataclass(frozen=True)
class Rule:
    """What one block's checked values must hold with each of its accelerators: `broken`
    says what is wrong (after "[[matrix]] #N: "), or nothing; `key` is the line it names."""

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

BUILTIN_DEFAULTS: dict[str, Any] = {
    "python": "3.11",
    "world_size": 2,
    "nodes": 1,
    "suites": ["suites"],
    "timeout": 300,
    "tiers": [],
    "external": [],
    "requirements": [],
    "fixes": "on",
    "torchao": "none",
    "torchtitan": "none",
}


def load_matrix(path: str | Path = "matrix.toml", *, external_suites: str | Path | None = None) -> Matrix:
    """Parse, validate and expand matrix.toml; raises a one-line MatrixError on any mistake.

    External suite names are checked against `external_suites` (default: the checkout's
    suites/external.toml, the file cell runs read), loaded only when some cell declares
    `external`; a mistake inside that file is its own one-line ConfigError.
    """
    path = Path(path)
    data, loc = _read_toml(path, kind=MatrixError, max_bytes=MAX_MATRIX_BYTES,
                           missing="distci reads the matrix from matrix.toml at the repo root")
    return _Loader(path, data, loc, Path(external_suites or EXTERNAL_SUITES)).load()


Where = tuple[str, "tuple[str, int] | None"]  # (label, section): what an error names, where its line is


class _Loader:
    """One load of matrix.toml: the tables checked key by key against KEYS, blocks expanded,
    then [[exclude]] and [[include]] applied. Every mistake raises a one-line MatrixError."""

    def __init__(self, path: Path, data: dict[str, Any], loc: _Locator, external_path: Path) -> None:
        self.path = path
        self.data = data
        self.loc = loc
        self.external_path = external_path
        self._external_names: tuple[str, ...] | None = None
        self.accelerators: dict[str, Accelerator] = {}
        self.tiers: dict[str, Tier] = {}

    def load(self) -> Matrix:
        data = self.data
        self._check_keys(data, TOP_KEYS, "top level", None)
        if data.get("schema") != SCHEMA:
            raise self.loc.error(f"top level: 'schema' must be {SCHEMA} (found {data.get('schema')!r}); "
                                 f"add `schema = {SCHEMA}` as the first line", None, "schema")
        self.accelerators = self._accelerators()
        self.tiers = tiers = self._tiers()
        raw_defaults = self._table(data, "defaults", "top level")
        self._check_keys(raw_defaults, DEFAULT_KEYS, DEFAULTS, ("defaults", 0))
        for key, value in raw_defaults.items():  # on its own, so its mistakes are not blamed on a block
            self._checked(KEY[key], value, (DEFAULTS, ("defaults", 0)))
        defaults = {**BUILTIN_DEFAULTS, **raw_defaults}

        blocks = self._array(data, "matrix")
        if not blocks:
            raise self.loc.error("top level: no [[matrix]] block; add at least one cell", None, None)
        cells: list[Cell] = []
        seen: dict[str, int] = {}
        for index, block in enumerate(blocks, 1):
            for cell in self._expand(block, index, defaults, len(cells)):
                if cell.id in seen:
                    other = seen[cell.id]
                    also = "this block" if other == index else f"[[matrix]] #{other}"
                    raise self.loc.error(
                        f"[[matrix]] #{index}: cell '{cell.id}' is produced twice (also by {also}); "
                        "remove the duplicate or change an axis", ("matrix", index - 1), None)
                seen[cell.id] = index
                cells.append(cell)

        final = self._apply_includes(self._apply_excludes(cells), cells)
        order = {name: i for i, name in enumerate(tiers)}
        final = [replace(c, tiers=tuple(sorted(c.tiers, key=order.__getitem__))) for c in final]
        for name, tier in tiers.items():
            jobs = sum(name in c.tiers for c in final) * tier.shards
            if jobs > MAX_JOBS:
                raise self.loc.error(f"[tiers.{name}]: {jobs} jobs (cells x shards) is past GitHub's {MAX_JOBS} per "
                                     "matrix; split the tier or lower its shards", (f"tiers.{name}", 0), "shards")
        return Matrix(path=self.path, cells=tuple(final), tiers=tiers, accelerators=self.accelerators)

    # ---- tables

    def _check_keys(self, table: dict[str, Any], allowed: Sequence[str], label: str,
                    section: tuple[str, int] | None) -> None:
        for key in table:
            if key not in allowed:
                hint = _suggest(key, allowed) or f"; allowed: {', '.join(allowed)}"
                raise self.loc.error(f"{label}: unknown key '{key}'{hint}", section, key)

    def _table(self, parent: dict[str, Any], key: str, label: str) -> dict[str, Any]:
        value = parent.get(key, {})
        if not isinstance(value, dict):
            raise self.loc.error(f"{label}: '{key}' must be a table ([{key}])", None, key)
        return value

    def _array(self, parent: dict[str, Any], key: str) -> list[dict[str, Any]]:
        value = parent.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.loc.error(f"top level: '{key}' must be an array of tables ([[{key}]])", None, key)
        return value

    def _accelerators(self) -> dict[str, Accelerator]:
        table = self._table(self.data, "accelerators", "top level")
        if not table:
            raise self.loc.error("top level: no [accelerators.<name>] table; declare cpu at least", None, None)
        result = {}
        for name, spec in table.items():
            section = (f"accelerators.{name}", 0)
            label = f"[accelerators.{name}]"
            if name not in KNOWN_ACCELERATORS:
                raise self.loc.error(f"{label}: unknown accelerator '{name}'{_suggest(name, KNOWN_ACCELERATORS)}; "
                                     f"known: {', '.join(KNOWN_ACCELERATORS)}", section, None)
            if not isinstance(spec, dict):
                raise self.loc.error(f"{label}: must be a table", section, None)
            self._check_keys(spec, ACCELERATOR_KEYS, label, section)
            for required in ACCELERATOR_REQUIRED:
                if required not in spec:
                    raise self.loc.error(f"{label}: missing key '{required}'", section, None)
            if spec["backend"] not in BACKENDS:
                raise self.loc.error(f"{label}: backend '{spec['backend']}' is not one of {', '.join(BACKENDS)}",
                                     section, "backend")
            at = (label, section)
            result[name] = Accelerator(
                name=name, backend=spec["backend"], runner=self._nonempty(spec["runner"], "runner", at),
                archs=self._strings(spec["archs"], "archs", at, allow_empty=False),
                variants=self._strings(spec["variants"], "variants", at, allow_empty=False),
                family=str(spec.get("family", name)), description=str(spec.get("description", "")),
                container=self._container(spec.get("container", {}), label, section),
            )
        return result

    def _container(self, table: Any, label: str, section: tuple[str, int]) -> ContainerLimits:
        where = (f"{section[0]}.container", 0)
        if not isinstance(table, dict):
            raise self.loc.error(f"{label}: 'container' must be a table ([{section[0]}.container])", section, "container")
        try:
            return ContainerLimits.from_table(table)
        except ValueError as exc:
            raise self.loc.error(f"[{section[0]}.container]: {exc}", where, None) from None

    def _tiers(self) -> dict[str, Tier]:
        table = self._table(self.data, "tiers", "top level")
        result = {}
        for name, spec in table.items():
            section = (f"tiers.{name}", 0)
            label = f"[tiers.{name}]"
            if not isinstance(spec, dict):
                raise self.loc.error(f"{label}: must be a table", section, None)
            self._check_keys(spec, TIER_KEYS, label, section)
            result[name] = Tier(
                name=name,
                description=str(spec.get("description", "")),
                blocking_suites=self._strings(spec.get("blocking_suites", []), "blocking_suites", (label, section)),
                shards=self._shards(spec.get("shards", 1), label, section),
            )
        return result

    def _shards(self, value: Any, label: str, section: tuple[str, int]) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_JOBS:
            raise self.loc.error(f"{label}: shards must be a whole number from 1 to {MAX_JOBS} (jobs per cell; "
                                 f"GitHub runs at most {MAX_JOBS} jobs per matrix), got {value!r}", section, "shards")
        return value

    # ---- one key's value (KEYS names these by `check`)

    def _checked(self, key: Key, value: Any, at: Where) -> Any:
        """A key's value checked by its `check`: each element of an axis (a tuple, in order,
        duplicates dropped), or the whole value of an attribute."""
        check = getattr(self, key.check)
        if not key.axis:
            return check(value, key.name, at)
        listed = value if isinstance(value, list) else [value]
        if not listed:
            raise self.loc.error(f"{at[0]}: '{key.name}' is an empty list; give at least one value", at[1], key.name)
        return tuple(dict.fromkeys(check(v, key.name, at) for v in listed))

    def _any(self, value: Any, key: str, at: Where) -> Any:
        return value

    def _strings(self, value: Any, key: str, at: Where, *, allow_empty: bool = True) -> tuple[str, ...]:
        label, section = at
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.loc.error(f"{label}: '{key}' must be a list of strings (got {value!r})", section, key)
        if not value and not allow_empty:
            raise self.loc.error(f"{label}: '{key}' is empty; give at least one value", section, key)
        return tuple(dict.fromkeys(value))

    def _nonempty(self, value: Any, key: str, at: Where) -> tuple[str, ...]:
        return self._strings(value, key, at, allow_empty=False)

    def _python(self, value: Any, key: str, at: Where) -> str:
        if not isinstance(value, str) or not value:
            raise self.loc.error(f"{at[0]}: 'python' must be a string like \"3.11\"", at[1], key)
        return value

    def _count(self, value: Any, key: str, at: Where) -> int:
        label, section = at
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.loc.error(f"{label}: '{key}' must be a positive integer (got {value!r})", section, key)
        if key in LIMITS and value > LIMITS[key]:
            raise self.loc.error(f"{label}: '{key}' = {value} is past the most distci runs ({LIMITS[key]})",
                                 section, key)
        return value

    def _fixes(self, value: Any, key: str, at: Where) -> str:
        if value not in FIXES:
            hint = f' (write "{"on" if value else "off"}")' if isinstance(value, bool) else ""
            raise self.loc.error(f"{at[0]}: fixes = {value!r} must be \"on\" or \"off\"{hint}", at[1], "fixes")
        return value

    def _source(self, value: Any, key: str, at: Where) -> Source:
        try:
            return Source.parse(key, value)
        except MatrixError as exc:
            raise self.loc.error(f"{at[0]}: {exc}", at[1], key) from None

    def _accelerator_name(self, value: Any, key: str, at: Where) -> str:
        if value not in self.accelerators:
            raise self.loc.error(f"{at[0]}: unknown accelerator '{value}'{_suggest(str(value), self.accelerators)}; "
                                 f"declared: {', '.join(self.accelerators)}", at[1], key)
        return value

    def _tier_names(self, value: Any, key: str, at: Where) -> tuple[str, ...]:
        names = self._strings(value, "tiers", at)
        for name in names:
            if name not in self.tiers:
                raise self.loc.error(f"{at[0]}: unknown tier '{name}'{_suggest(name, self.tiers)}; declare "
                                     f"[tiers.{name}] or use one of: {', '.join(self.tiers) or 'none declared'}",
                                     at[1], "tiers")
        return names

    def _external(self, value: Any, key: str, at: Where) -> tuple[str, ...]:
        names = self._strings(value, "external", at)
        if not names:
            return names
        if self._external_names is None:
            if not self.external_path.is_file():
                raise self.loc.error(f"{at[0]}: 'external' names suites of {self.external_path}, which does not "
                                     "exist; declare them there or remove 'external'", at[1], "external")
            self._external_names = tuple(s.name for s in load_suites(self.external_path))
        declared = self._external_names
        for name in names:
            if name not in declared:
                hint = _suggest(name, declared) or f"; declared: {', '.join(declared) or 'none'}"
                raise self.loc.error(f"{at[0]}: unknown external suite '{name}'{hint}", at[1], "external")
        return names

    def _requirements(self, value: Any, key: str, at: Where) -> tuple[str, ...]:
        lines = self._strings(value, "requirements", at)
        for line in lines:
            try:
                Requirement(line)
            except InvalidRequirement as exc:
                why = str(exc).splitlines()[0]
                raise self.loc.error(f"{at[0]}: requirements entry {line!r} is not a pip requirement ({why})",
                                     at[1], "requirements") from None
        return lines

    # ---- expansion

    def _expand(self, block: dict[str, Any], index: int, defaults: dict[str, Any], so_far: int) -> list[Cell]:
        section = ("matrix", index - 1)
        label = f"[[matrix]] #{index}"
        at = (label, section)
        self._check_keys(block, BLOCK_KEYS, label, section)
        for required in ("accelerator", "torch"):
            if required not in block and required not in defaults:
                example = 'accelerator = "cpu"' if required == "accelerator" else 'torch = "2.13.0"'
                raise self.loc.error(f"{label}: missing key '{required}' (e.g. {example})", section, None)
        merged = {**defaults, **block}
        value = {key: self._checked(KEY[key], merged[key], at) for key in KEYS_ORDER if key in merged}
        cells = []
        for acc_name in value["accelerator"]:
            acc = self.accelerators[acc_name]
            for rule in RULES:
                problem = rule.broken(value, acc)
                if problem:
                    raise self.loc.error(f"{label}: {problem}", section, rule.key)
            archs = value.get("arch", (acc.archs[0],))
            variants = value.get("variant", (acc.variants[0],))
            axes = (archs, variants, value["torch"], value["torchao"], value["torchtitan"],
                    value.get("torch_npu", (None,)), value["fixes"], value["world_size"], value["nodes"])
            count = math.prod(map(len, axes))
            if so_far + len(cells) + count > MAX_JOBS:
                raise self.loc.error(f"{label}: expands to {so_far + len(cells) + count} cells, past GitHub's {MAX_JOBS} "
                                     "jobs per matrix; shorten its lists", section, None)
            for arch, variant, torch, ao, titan, npu, fix, ws, nodes in itertools.product(*axes):
                cells.append(Cell(
                    accelerator=acc_name, arch=arch, variant=variant, torch=torch, torchao=ao,
                    torchtitan=titan, torch_npu=npu, fixes=fix, world_size=ws, nodes=nodes, suites=value["suites"],
                    tiers=value["tiers"], runner=acc.runner, backend=acc.backend, python=value["python"],
                    timeout=value["timeout"], family=acc.family, external=value["external"],
                    requirements=value["requirements"], container=acc.container,
                ))
        return cells

    # ---- rules

    def _matcher(self, rule: Any, at: Where, *, key_prefix: str = "") -> Callable[[Cell], bool]:
        """Validate a rule's axis=value table and return a predicate over cells."""
        label, section = at
        if not isinstance(rule, dict):
            raise self.loc.error(f"{label}: 'match' must be a table like {{accelerator = \"cuda\"}}", section, "match")
        wanted: dict[str, list[Any]] = {}
        for axis, value in rule.items():
            if axis not in AXES:
                hint = _suggest(axis, AXES) or f"; match on: {', '.join(AXES)}"
                raise self.loc.error(f"{label}: unknown key '{key_prefix}{axis}'{hint}", section, axis)
            wanted[axis] = [_comparable(v) for v in self._checked(KEY[axis], value, at)]

        def matches(cell: Cell) -> bool:
            return all(_comparable(getattr(cell, axis)) in accepted for axis, accepted in wanted.items())

        return matches

    def _apply_excludes(self, cells: list[Cell]) -> list[Cell]:
        kept = list(cells)
        for index, rule in enumerate(self._array(self.data, "exclude"), 1):
            section = ("exclude", index - 1)
            label = f"[[exclude]] #{index}"
            if not rule:
                raise self.loc.error(f"{label}: empty rule; give axis = value pairs to exclude", section, None)
            matches = self._matcher(rule, (label, section))
            if not any(matches(c) for c in cells):
                raise self.loc.error(f"{label}: matches no cell; fix the values or delete the rule", section, None)
            kept = [c for c in kept if not matches(c)]
        return kept

    def _apply_includes(self, cells: list[Cell], expanded: list[Cell]) -> list[Cell]:
        result = list(cells)
        for index, rule in enumerate(self._array(self.data, "include"), 1):
            section = ("include", index - 1)
            label = f"[[include]] #{index}"
            self._check_keys(rule, INCLUDE_KEYS, label, section)
            if "match" not in rule:
                raise self.loc.error(f"{label}: missing 'match' (e.g. match = {{accelerator = \"cpu\"}})", section, None)
            changes = {k: v for k, v in rule.items() if k != "match"}
            if not changes:
                raise self.loc.error(f"{label}: sets nothing; add one of: {', '.join(INCLUDE_KEYS[1:])}", section, None)
            matches = self._matcher(rule["match"], (label, section), key_prefix="match.")
            update = {key: self._checked(KEY[key], value, (label, section)) for key, value in changes.items()}
            hits = [i for i, c in enumerate(result) if matches(c)]
            if not hits:
                why = " (the cells it matches are removed by [[exclude]])" if any(matches(c) for c in expanded) else ""
                raise self.loc.error(f"{label}: matches no cell{why}; fix 'match' or delete the rule", section, "match")
            for i in hits:
                cell = result[i]
                result[i] = replace(cell, **{
                    key: tuple(dict.fromkeys((*getattr(cell, key), *value))) if KEY[key].include == "add" else value
                    for key, value in update.items()})
        return result


KEYS_ORDER = tuple(k.name for k in KEYS)
"""The order a block's keys are checked in: KEYS', so the first mistake reported is stable."""


def _comparable(value: Any) -> Any:
    """What a rule compares: a Source by its id fragment (as the cell id spells it)."""
    return value.id_fragment if isinstance(value, Source) else value
