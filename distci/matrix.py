"""Load and validate matrix.toml, expand it into Cells, and derive the CI matrix from it.

matrix.toml is the single source of truth for axes, cells, tiers and runner labels (the
schema is documented at the top of the file itself). Every mistake in it becomes one
`MatrixError` line that names the file, line, block and key, and says what to write
instead, because a CI matrix that silently drops a cell is worse than one that fails.
"""

from __future__ import annotations

import itertools
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from packaging.requirements import InvalidRequirement, Requirement

from distci.errors import MatrixError
from distci.tomlloc import Locator as _Locator, suggest as _suggest
from distci.external.spec import DEFAULT_PATH as EXTERNAL_PATH, load_suites
from distci.provision.sources import PACKAGE_AXES, Source
from distci.cells import Accelerator, Cell, ContainerLimits, Matrix, Tier

SCHEMA = 1
# The checkout's external suites: the file cell runs read (distci.run.cellrun), so names are
# checked against what will run, wherever the matrix file itself lives.
EXTERNAL_SUITES = Path(__file__).resolve().parents[1] / EXTERNAL_PATH

KNOWN_ACCELERATORS = ("cpu", "cuda", "npu")
BACKENDS = ("gloo", "nccl", "hccl")
FIXES = ("on", "off")

# Product axes: each list-valued one multiplies the cells of its block; they make the id.
AXES = ("accelerator", "arch", "variant", *PACKAGE_AXES, "fixes", "world_size", "nodes")
# Attributes: carried by every cell of the block, never part of the id.
ATTRIBUTES = ("suites", "tiers", "python", "timeout", "external", "requirements")
BLOCK_KEYS = AXES + ATTRIBUTES
DEFAULT_KEYS = ("python", "world_size", "nodes", "suites", "timeout", "tiers", "external", "requirements", "fixes", "torch",
                "torchao", "torchtitan")
TOP_KEYS = ("schema", "defaults", "accelerators", "matrix", "exclude", "include", "tiers")
ACCELERATOR_KEYS = ("backend", "runner", "archs", "variants", "family", "description", "container")
TIER_KEYS = ("description", "blocking_suites", "shards")
INCLUDE_SET_KEYS = ("tiers", "suites", "external", "runner", "timeout", "python")
# List-valued attributes an [[include]] adds to, rather than replaces.
INCLUDE_ADD_KEYS = ("tiers", "suites", "external")
INCLUDE_KEYS = ("match", *INCLUDE_SET_KEYS)

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


# --------------------------------------------------------------------------- errors


# --------------------------------------------------------------------------- loading


def load_matrix(path: str | Path = "matrix.toml", *, external_suites: str | Path | None = None) -> Matrix:
    """Parse, validate and expand matrix.toml; raises a one-line MatrixError on any mistake.

    External suite names are checked against `external_suites` (default: the checkout's
    suites/external.toml, the file cell runs read), loaded only when some cell declares
    `external`; a mistake inside that file is its own one-line ConfigError.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MatrixError("file not found; distci reads the matrix from matrix.toml at the repo root",
                          where=str(path)) from None
    loc = _Locator(path, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        match = re.search(r"at line (\d+)", msg)
        where = f"{path}:{match.group(1)}" if match else str(path)
        raise MatrixError(f"invalid TOML: {msg}", where=where) from None
    return _Loader(path, data, loc, Path(external_suites or EXTERNAL_SUITES)).load()


class _Loader:
    def __init__(self, path: Path, data: dict[str, Any], loc: _Locator, external_path: Path) -> None:
        self.path = path
        self.data = data
        self.loc = loc
        self.external_path = external_path
        self._external_names: tuple[str, ...] | None = None

    def load(self) -> Matrix:
        data = self.data
        self._check_keys(data, TOP_KEYS, "top level", None)
        if data.get("schema") != SCHEMA:
            raise self.loc.error(f"top level: 'schema' must be {SCHEMA} (found {data.get('schema')!r}); "
                                 f"add `schema = {SCHEMA}` as the first line", None, "schema")
        accelerators = self._accelerators()
        tiers = self._tiers()
        defaults = dict(BUILTIN_DEFAULTS)
        raw_defaults = self._table(data, "defaults", "top level")
        self._check_keys(raw_defaults, DEFAULT_KEYS, "[defaults]", ("defaults", 0))
        self._check_defaults(raw_defaults, tiers)
        defaults.update(raw_defaults)

        blocks = self._array(data, "matrix")
        if not blocks:
            raise self.loc.error("top level: no [[matrix]] block; add at least one cell", None, None)
        cells: list[tuple[Cell, int]] = []
        seen: dict[str, int] = {}
        for index, block in enumerate(blocks, 1):
            for cell in self._expand(block, index, defaults, accelerators, tiers):
                if cell.id in seen:
                    other = seen[cell.id]
                    also = "this block" if other == index else f"[[matrix]] #{other}"
                    raise self.loc.error(
                        f"[[matrix]] #{index}: cell '{cell.id}' is produced twice (also by {also}); "
                        "remove the duplicate or change an axis", ("matrix", index - 1), None)
                seen[cell.id] = index
                cells.append((cell, index))

        kept = self._apply_excludes([c for c, _ in cells], accelerators)
        final = self._apply_includes(kept, [c for c, _ in cells], accelerators, tiers)
        order = {name: i for i, name in enumerate(tiers)}
        final = [replace(c, tiers=tuple(sorted(c.tiers, key=order.__getitem__))) for c in final]
        return Matrix(path=self.path, cells=tuple(final), tiers=tiers, accelerators=accelerators)

    # ---- helpers

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

    def _strings(self, value: Any, key: str, label: str, section: tuple[str, int] | None,
                 *, allow_scalar: bool = True, allow_empty: bool = True) -> tuple[str, ...]:
        if isinstance(value, str) and allow_scalar:
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.loc.error(f"{label}: '{key}' must be a list of strings (got {value!r})", section, key)
        if not value and not allow_empty:
            raise self.loc.error(f"{label}: '{key}' is empty; give at least one value", section, key)
        return tuple(dict.fromkeys(value))

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
            for required in ("backend", "runner", "archs", "variants"):
                if required not in spec:
                    raise self.loc.error(f"{label}: missing key '{required}'", section, None)
            backend = spec["backend"]
            if backend not in BACKENDS:
                raise self.loc.error(f"{label}: backend '{backend}' is not one of {', '.join(BACKENDS)}",
                                     section, "backend")
            result[name] = Accelerator(
                name=name,
                backend=backend,
                runner=self._strings(spec["runner"], "runner", label, section, allow_empty=False),
                archs=self._strings(spec["archs"], "archs", label, section, allow_empty=False),
                variants=self._strings(spec["variants"], "variants", label, section, allow_empty=False),
                family=str(spec.get("family", name)),
                description=str(spec.get("description", "")),
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
                blocking_suites=self._strings(spec.get("blocking_suites", []), "blocking_suites", label, section),
                shards=self._shards(spec.get("shards", 1), label, section),
            )
        return result

    def _shards(self, value: Any, label: str, section: tuple[str, int]) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.loc.error(f"{label}: shards must be a whole number >= 1 (jobs per cell), got {value!r}",
                                 section, "shards")
        return value

    def _tier_names(self, value: Any, label: str, section: tuple[str, int], tiers: dict[str, Tier]) -> tuple[str, ...]:
        names = self._strings(value, "tiers", label, section)
        for name in names:
            if name not in tiers:
                raise self.loc.error(f"{label}: unknown tier '{name}'{_suggest(name, tiers)}; "
                                     f"declare [tiers.{name}] or use one of: {', '.join(tiers) or 'none declared'}",
                                     section, "tiers")
        return names

    def _external(self, value: Any, label: str, section: tuple[str, int]) -> tuple[str, ...]:
        names = self._strings(value, "external", label, section)
        if not names:
            return names
        if self._external_names is None:
            if not self.external_path.is_file():
                raise self.loc.error(f"{label}: 'external' names suites of {self.external_path}, which does not "
                                     "exist; declare them there or remove 'external'", section, "external")
            self._external_names = tuple(s.name for s in load_suites(self.external_path))
        declared = self._external_names
        for name in names:
            if name not in declared:
                hint = _suggest(name, declared) or f"; declared: {', '.join(declared) or 'none'}"
                raise self.loc.error(f"{label}: unknown external suite '{name}'{hint}", section, "external")
        return names

    def _requirements(self, value: Any, label: str, section: tuple[str, int]) -> tuple[str, ...]:
        lines = self._strings(value, "requirements", label, section)
        for line in lines:
            try:
                Requirement(line)
            except InvalidRequirement as exc:
                why = str(exc).splitlines()[0]
                raise self.loc.error(f"{label}: requirements entry {line!r} is not a pip requirement ({why})",
                                     section, "requirements") from None
        return lines

    def _positive_int(self, value: Any, key: str, label: str, section: tuple[str, int]) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.loc.error(f"{label}: '{key}' must be a positive integer (got {value!r})", section, key)
        return value

    def _nodes(self, value: Any, world_sizes: list[int], label: str, section: tuple[str, int]) -> int:
        """A node count that splits every world size of the block into whole ranks per node."""
        nodes = self._positive_int(value, "nodes", label, section)
        uneven = [ws for ws in world_sizes if ws % nodes]
        if uneven:
            raise self.loc.error(f"{label}: world_size {uneven[0]} is not a multiple of nodes = {nodes} (every "
                                 "node runs the same number of ranks); change world_size or nodes", section, "nodes")
        return nodes

    def _fixes(self, value: Any, label: str, section: tuple[str, int]) -> str:
        if value not in FIXES:
            hint = f' (write "{"on" if value else "off"}")' if isinstance(value, bool) else ""
            raise self.loc.error(f"{label}: fixes = {value!r} must be \"on\" or \"off\"{hint}", section, "fixes")
        return value

    def _source(self, axis: str, value: Any, label: str, section: tuple[str, int]) -> Source:
        try:
            return Source.parse(axis, value)
        except MatrixError as exc:
            raise self.loc.error(f"{label}: {exc}", section, axis) from None

    def _check_defaults(self, raw: dict[str, Any], tiers: dict[str, Tier]) -> None:
        """Check [defaults] on its own, so its mistakes are not blamed on the first block."""
        section, label = ("defaults", 0), "[defaults]"
        for key, value in raw.items():
            listed = value if isinstance(value, list) else [value]
            if key == "tiers":
                self._tier_names(value, label, section, tiers)
            elif key == "suites":
                self._strings(value, key, label, section, allow_empty=False)
            elif key == "external":
                self._external(value, label, section)
            elif key == "requirements":
                self._requirements(value, label, section)
            elif key in ("world_size", "nodes", "timeout"):
                for v in listed:
                    self._positive_int(v, key, label, section)
            elif key == "fixes":
                for v in listed:
                    self._fixes(v, label, section)
            elif key in PACKAGE_AXES:
                for v in listed:
                    self._source(key, v, label, section)
            elif key == "python" and (not isinstance(value, str) or not value):
                raise self.loc.error(f"{label}: 'python' must be a string like \"3.11\"", section, key)

    # ---- expansion

    def _expand(self, block: dict[str, Any], index: int, defaults: dict[str, Any],
                accelerators: dict[str, Accelerator], tiers: dict[str, Tier]) -> list[Cell]:
        section = ("matrix", index - 1)
        label = f"[[matrix]] #{index}"
        self._check_keys(block, BLOCK_KEYS, label, section)
        for required in ("accelerator", "torch"):
            if required not in block and required not in defaults:
                example = 'accelerator = "cpu"' if required == "accelerator" else 'torch = "2.13.0"'
                raise self.loc.error(f"{label}: missing key '{required}' (e.g. {example})", section, None)
        merged = {**defaults, **block}

        def values(key: str) -> list[Any]:
            value = merged[key]
            listed = value if isinstance(value, list) else [value]
            if not listed:
                raise self.loc.error(f"{label}: '{key}' is an empty list; give at least one value", section, key)
            return list(dict.fromkeys(listed))

        suites = self._strings(merged["suites"], "suites", label, section, allow_empty=False)
        cell_tiers = self._tier_names(merged["tiers"], label, section, tiers)
        external = self._external(merged["external"], label, section)
        requirements = self._requirements(merged["requirements"], label, section)
        python = merged["python"]
        if not isinstance(python, str) or not python:
            raise self.loc.error(f"{label}: 'python' must be a string like \"3.11\"", section, "python")
        timeout = self._positive_int(merged["timeout"], "timeout", label, section)
        world_sizes = [self._positive_int(v, "world_size", label, section) for v in values("world_size")]
        node_counts = [self._nodes(v, world_sizes, label, section) for v in values("nodes")]
        fixes = [self._fixes(v, label, section) for v in values("fixes")]
        sources = {axis: [self._source(axis, v, label, section) for v in values(axis)]
                   for axis in ("torch", "torchao", "torchtitan")}
        if any(s.kind == "none" for s in sources["torch"]):
            raise self.loc.error(f"{label}: torch = 'none' is not allowed; every cell needs torch", section, "torch")

        cells = []
        for acc_name in values("accelerator"):
            if acc_name not in accelerators:
                raise self.loc.error(f"{label}: unknown accelerator '{acc_name}'{_suggest(str(acc_name), accelerators)}; "
                                     f"declared: {', '.join(accelerators)}", section, "accelerator")
            acc = accelerators[acc_name]
            archs = values("arch") if "arch" in merged else [acc.archs[0]]
            variants = values("variant") if "variant" in merged else [acc.variants[0]]
            for arch in archs:
                if arch not in acc.archs:
                    raise self.loc.error(f"{label}: arch '{arch}' is not in [accelerators.{acc_name}] archs "
                                         f"({', '.join(acc.archs)})", section, "arch")
            for variant in variants:
                if variant not in acc.variants:
                    raise self.loc.error(f"{label}: variant '{variant}' is not in [accelerators.{acc_name}] variants "
                                         f"({', '.join(acc.variants)}); put other accelerators in their own block",
                                         section, "variant")
            if acc_name == "npu":
                if "torch_npu" not in merged:
                    raise self.loc.error(f"{label}: an npu cell needs torch_npu (e.g. torch_npu = \"~=2.13.0\")",
                                         section, None)
                npus: list[Source | None] = [self._source("torch_npu", v, label, section) for v in values("torch_npu")]
            else:
                if "torch_npu" in merged:
                    raise self.loc.error(f"{label}: torch_npu is only for accelerator 'npu' (this block has "
                                         f"'{acc_name}')", section, "torch_npu")
                npus = [None]
            for arch, variant, torch, ao, titan, npu, fix, ws, nodes in itertools.product(
                archs, variants, sources["torch"], sources["torchao"], sources["torchtitan"], npus, fixes, world_sizes,
                node_counts,
            ):
                cells.append(Cell(
                    accelerator=acc_name, arch=arch, variant=variant, torch=torch, torchao=ao,
                    torchtitan=titan, torch_npu=npu, fixes=fix, world_size=ws, nodes=nodes, suites=suites,
                    tiers=cell_tiers, runner=acc.runner, backend=acc.backend, python=python,
                    timeout=timeout, family=acc.family, external=external, requirements=requirements,
                    container=acc.container,
                ))
        return cells

    # ---- rules

    def _matcher(self, rule: dict[str, Any], label: str, section: tuple[str, int],
                 accelerators: dict[str, Accelerator], *, key_prefix: str = ""):
        """Validate a rule's axis=value table and return a predicate over cells."""
        if not isinstance(rule, dict):
            raise self.loc.error(f"{label}: 'match' must be a table like {{accelerator = \"cuda\"}}", section, "match")
        wanted: dict[str, list[Any]] = {}
        for axis, value in rule.items():
            if axis not in AXES:
                hint = _suggest(axis, AXES) or f"; match on: {', '.join(AXES)}"
                raise self.loc.error(f"{label}: unknown key '{key_prefix}{axis}'{hint}", section, axis)
            listed = value if isinstance(value, list) else [value]
            if axis in PACKAGE_AXES:
                wanted[axis] = [self._source(axis, v, label, section).id_fragment for v in listed]
            elif axis == "accelerator":
                for v in listed:
                    if v not in accelerators:
                        raise self.loc.error(f"{label}: unknown accelerator '{v}'{_suggest(str(v), accelerators)}",
                                             section, axis)
                wanted[axis] = listed
            elif axis == "fixes":
                wanted[axis] = [self._fixes(v, label, section) for v in listed]
            elif axis in ("world_size", "nodes"):
                wanted[axis] = [self._positive_int(v, axis, label, section) for v in listed]
            else:
                wanted[axis] = listed

        def matches(cell: Cell) -> bool:
            for axis, accepted in wanted.items():
                value = getattr(cell, axis)
                if axis in PACKAGE_AXES:
                    value = value.id_fragment if value is not None else None
                if value not in accepted:
                    return False
            return True

        return matches

    def _apply_excludes(self, cells: list[Cell], accelerators: dict[str, Accelerator]) -> list[Cell]:
        kept = list(cells)
        for index, rule in enumerate(self._array(self.data, "exclude"), 1):
            section = ("exclude", index - 1)
            label = f"[[exclude]] #{index}"
            if not rule:
                raise self.loc.error(f"{label}: empty rule; give axis = value pairs to exclude", section, None)
            matches = self._matcher(rule, label, section, accelerators)
            if not any(matches(c) for c in cells):
                raise self.loc.error(f"{label}: matches no cell; fix the values or delete the rule", section, None)
            kept = [c for c in kept if not matches(c)]
        return kept

    def _apply_includes(self, cells: list[Cell], expanded: list[Cell], accelerators: dict[str, Accelerator],
                        tiers: dict[str, Tier]) -> list[Cell]:
        result = list(cells)
        for index, rule in enumerate(self._array(self.data, "include"), 1):
            section = ("include", index - 1)
            label = f"[[include]] #{index}"
            self._check_keys(rule, INCLUDE_KEYS, label, section)
            if "match" not in rule:
                raise self.loc.error(f"{label}: missing 'match' (e.g. match = {{accelerator = \"cpu\"}})", section, None)
            changes = {k: v for k, v in rule.items() if k != "match"}
            if not changes:
                raise self.loc.error(f"{label}: sets nothing; add one of: {', '.join(INCLUDE_SET_KEYS)}", section, None)
            matches = self._matcher(rule["match"], label, section, accelerators, key_prefix="match.")
            update: dict[str, Any] = {}
            if "tiers" in changes:
                update["tiers"] = self._tier_names(changes["tiers"], label, section, tiers)
            if "suites" in changes:
                update["suites"] = self._strings(changes["suites"], "suites", label, section)
            if "external" in changes:
                update["external"] = self._external(changes["external"], label, section)
            if "runner" in changes:
                update["runner"] = self._strings(changes["runner"], "runner", label, section, allow_empty=False)
            if "timeout" in changes:
                update["timeout"] = self._positive_int(changes["timeout"], "timeout", label, section)
            if "python" in changes:
                if not isinstance(changes["python"], str):
                    raise self.loc.error(f"{label}: 'python' must be a string like \"3.11\"", section, "python")
                update["python"] = changes["python"]
            hits = [i for i, c in enumerate(result) if matches(c)]
            if not hits:
                why = " (the cells it matches are removed by [[exclude]])" if any(matches(c) for c in expanded) else ""
                raise self.loc.error(f"{label}: matches no cell{why}; fix 'match' or delete the rule", section, "match")
            for i in hits:
                cell = result[i]
                fields_: dict[str, Any] = {}
                for key, value in update.items():
                    if key in INCLUDE_ADD_KEYS:
                        value = tuple(dict.fromkeys((*getattr(cell, key), *value)))
                    fields_[key] = value
                result[i] = replace(cell, **fields_)
        return result
