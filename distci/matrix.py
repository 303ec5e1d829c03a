"""Load and validate matrix.toml, expand it into Cells, and derive the CI matrix from it.

matrix.toml is the single source of truth for axes, cells, tiers and runner labels (the
schema is documented at the top of the file itself). Every mistake in it becomes one
`MatrixError` line that names the file, line, block and key, and says what to write
instead, because a CI matrix that silently drops a cell is worse than one that fails.

The grammar is data (distci/matrix_keys.py: KEYS and RULES, as the scenario table's
COLUMNS / RULES); this module is the one loop that reads the file against it, expands the
blocks and applies [[exclude]] / [[include]].
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from distci.errors import MatrixError
from distci.tomlloc import Locator as _Locator, read as _read_toml, suggest as _suggest
from distci.sources import Source
from distci.cells import Accelerator, Cell, ContainerLimits, Matrix, Tier
from distci.matrix_keys import (
    ACCELERATOR_KEYS, ACCELERATOR_REQUIRED, AXES, BACKENDS, BLOCK_KEYS, BUILTIN_DEFAULTS, DEFAULT_KEYS, DEFAULTS,
    INCLUDE_KEYS, KEY, KEYS_ORDER, KNOWN_ACCELERATORS, MAX_JOBS, RULES, TIER_KEYS, TOP_KEYS, Declared, Invalid, Key,
    nonempty, strings,
)

SCHEMA = 1
MAX_MATRIX_BYTES = 1 << 20
"""A matrix is a few KB; a file past 1 MiB is the wrong file."""


def load_matrix(path: str | Path = "matrix.toml", *,
                external_names: Callable[[], Sequence[str]] | None = None) -> Matrix:
    """Parse, validate and expand matrix.toml; raises a one-line MatrixError on any mistake.

    `external_names` gives the declared external suites' names (the stage that owns them:
    `distci.external.spec.suite_names`), called once, when some cell first declares
    `external`; it raises FileNotFoundError when their file is missing. None: `external`
    values are checked for their shape only (commands that run no external suite).
    """
    path = Path(path)
    data, loc = _read_toml(path, kind=MatrixError, max_bytes=MAX_MATRIX_BYTES,
                           missing="distci reads the matrix from matrix.toml at the repo root")
    return _Loader(path, data, loc, external_names).load()


Where = tuple[str, "tuple[str, int] | None"]  # (label, section): what an error names, where its line is


class _Loader:
    """One load of matrix.toml: the tables checked key by key against KEYS, blocks expanded,
    then [[exclude]] and [[include]] applied. Every mistake raises a one-line MatrixError."""

    def __init__(self, path: Path, data: dict[str, Any], loc: _Locator,
                 external_names: Callable[[], Sequence[str]] | None) -> None:
        self.path = path
        self.data = data
        self.loc = loc
        self.declared = Declared(external_names=external_names)
        self.baseline_at: dict[str, Where] = {}
        """Cell id -> the block or [[include]] that set its baseline, for the error's line."""

    def load(self) -> Matrix:
        data = self.data
        self._check_keys(data, TOP_KEYS, "top level", None)
        if data.get("schema") != SCHEMA:
            raise self.loc.error(f"top level: 'schema' must be {SCHEMA} (found {data.get('schema')!r}); "
                                 f"add `schema = {SCHEMA}` as the first line", None, "schema")
        self.declared.accelerators = self._accelerators()
        self.declared.tiers = tiers = self._tiers()
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
        self._check_baselines(final, cells)
        order = {name: i for i, name in enumerate(tiers)}
        final = [replace(c, tiers=tuple(sorted(c.tiers, key=order.__getitem__))) for c in final]
        for name, tier in tiers.items():
            jobs = sum(name in c.tiers for c in final) * tier.shards
            if jobs > MAX_JOBS:
                raise self.loc.error(f"[tiers.{name}]: {jobs} jobs (cells x shards) is past GitHub's {MAX_JOBS} per "
                                     "matrix; split the tier or lower its shards", (f"tiers.{name}", 0), "shards")
        return Matrix(path=self.path, cells=tuple(final), tiers=tiers, accelerators=self.declared.accelerators)

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
                name=name, backend=spec["backend"], runner=self._value(nonempty, spec["runner"], "runner", at),
                archs=self._value(nonempty, spec["archs"], "archs", at),
                variants=self._value(nonempty, spec["variants"], "variants", at),
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
                blocking_suites=self._value(strings, spec.get("blocking_suites", []), "blocking_suites", (label, section)),
                shards=self._shards(spec.get("shards", 1), label, section),
            )
        return result

    def _shards(self, value: Any, label: str, section: tuple[str, int]) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_JOBS:
            raise self.loc.error(f"{label}: shards must be a whole number from 1 to {MAX_JOBS} (jobs per cell; "
                                 f"GitHub runs at most {MAX_JOBS} jobs per matrix), got {value!r}", section, "shards")
        return value

    # ---- one key's value (its Key's check, the error placed where it was written)

    def _value(self, check: Callable[..., Any], value: Any, key: str, at: Where) -> Any:
        try:
            return check(value, key, self.declared)
        except Invalid as exc:
            raise self.loc.error(f"{at[0]}: {exc}", at[1], key) from None

    def _checked(self, key: Key, value: Any, at: Where) -> Any:
        """A key's value checked by its `check`: each element of an axis (a tuple, in order,
        duplicates dropped), or the whole value of an attribute."""
        if not key.axis:
            return self._value(key.check, value, key.name, at)
        listed = value if isinstance(value, list) else [value]
        if not listed:
            raise self.loc.error(f"{at[0]}: '{key.name}' is an empty list; give at least one value", at[1], key.name)
        return tuple(dict.fromkeys(self._value(key.check, v, key.name, at) for v in listed))

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
            acc = self.declared.accelerators[acc_name]
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
                    requirements=value["requirements"], container=acc.container, baseline=value.get("baseline"),
                ))
        if "baseline" in value:
            self.baseline_at.update((c.id, at) for c in cells)
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

    def _check_baselines(self, cells: list[Cell], expanded: list[Cell]) -> None:
        """A baseline names another cell of the final matrix (the gate and rejudge read its
        history): a typo, an excluded cell or the cell itself would judge against nothing."""
        ids = [c.id for c in cells]
        for cell in cells:
            if cell.baseline is None:
                continue
            label, section = self.baseline_at[cell.id]
            if cell.baseline == cell.id:
                raise self.loc.error(f"{label}: cell '{cell.id}' names itself as its baseline (its own history is "
                                     "already what it is judged against); remove 'baseline'", section, "baseline")
            if cell.baseline not in ids:
                if any(c.id == cell.baseline for c in expanded):
                    hint = " (it is removed by [[exclude]])"
                else:
                    hint = _suggest(cell.baseline, [i for i in ids if i != cell.id]) or "; `nox -s matrix` lists the cells"
                raise self.loc.error(f"{label}: baseline '{cell.baseline}' of cell '{cell.id}' is not a cell of this "
                                     f"matrix{hint}", section, "baseline")

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
            if "baseline" in update:
                self.baseline_at.update((result[i].id, (label, section)) for i in hits)
            for i in hits:
                cell = result[i]
                result[i] = replace(cell, **{
                    key: tuple(dict.fromkeys((*getattr(cell, key), *value))) if KEY[key].include == "add" else value
                    for key, value in update.items()})
        return result



def _comparable(value: Any) -> Any:
    """What a rule compares: a Source by its id fragment (as the cell id spells it)."""
    return value.id_fragment if isinstance(value, Source) else value
