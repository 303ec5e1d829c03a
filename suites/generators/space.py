"""The cell side of the fuzzer's space: the axes the scenario table's rows are points of.

distci.fuzz.space draws and shrinks in a space whose axes, validity and point ids come from
here (`AXES`, `complete`, `problems`, `key`): the controller loads this module from the
checkout's suites (distci.fuzz.space.cell_side), so the columns are declared once, in
suites/scenario/table.py, and the package carries no copy of them. `ENTRY_TEST`, `CONFIGS_ENV`
and `CONFIG_ENV` are how the controller hands a batch to suites/fuzz_entry.py.

A point is one value per axis. Most axes are the table's columns (suites/scenario/table.py's
COLUMNS, every column but the tier): their ordered values and their defaults (the value
the id leaves out), so a column added there is an axis here with nothing else to write.
After them come the SIZES, axes of the fuzzer only (no table column: every row runs the
defaults): steps, model width, sequence length and depth. The shrinker halves a size down
to its smallest value, below the table's default, so a find is as small as it can be
and says which size it needs (a bug of the second step shrinks to `steps2`); a sized
point is a `SizedScenario`, whose id ends in the sizes off their default (`-steps2-dim64`).
Which combinations are valid is the table's own RULES, applied by building the Scenario,
SIZE_RULES for the sizes, plus what this accelerator cannot run (`Scenario.needs`): an
invalid draw is never run. Every row of the fixed table is `point_of(row)`, a named point.

Importable without torch: the controller draws and shrinks here, the cell's environment
runs what it drew.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..scenario import table as sc

ENTRY_TEST = "suites/fuzz_entry.py"
CONFIGS_ENV = "DISTCI_FUZZ_CONFIGS"
"""A JSON file: the list of points one batch runs (suites/fuzz_entry.py reads it)."""
CONFIG_ENV = "DISTCI_FUZZ_CONFIG"
"""Inline JSON: one point (axes at their defaults left out), for a repro."""
from .config_plants import PLANT_ENV  # noqa: E402,F401 - the plant a run carries, read by the controller

Point = Mapping[str, Any]
"""axis name -> value; missing axes take their defaults."""


@dataclass(frozen=True)
class Axis:
    """One column as the fuzzer sees it: its values in order (shrinking walks toward
    `default`, then toward the front), and whether it is a size (a number the shrinker
    halves toward the default)."""

    name: str
    values: tuple
    default: Any
    size: bool = False
    least: Any = None
    """Where shrinking a size ends (None: at `default`); a SIZES axis shrinks to its smallest value."""

    def __post_init__(self) -> None:
        if self.default not in self.values:
            raise ValueError(f"axis {self.name}: default {self.default!r} is not one of {self.values}")

    @property
    def goal(self) -> Any:
        """The value shrinking moves this axis toward."""
        return self.default if self.least is None else self.least


def _axis(column: sc.Column) -> Axis:
    """A column's axis; a column every row must name (parallel) shrinks toward its first value."""
    default = column.values[0] if column.default is sc.REQUIRED else column.default
    return Axis(column.name, tuple(column.values), default, size=column.type is int)


SIZES: tuple[Axis, ...] = (
    Axis("steps", (1, 2, 3, 4, 6), sc.STEPS, size=True, least=1),
    Axis("dim", (64, 128, 256), sc.MODEL.dim, size=True, least=64),
    Axis("seq", (16, 32, 64), sc.MODEL.max_seq_len, size=True, least=16),
    Axis("layers", (1, 2, 3), sc.MODEL.n_layers, size=True, least=1),
)
"""The fuzzer's own size axes (see the module docstring). dim scales the model's width:
ffn_hidden 2 x dim, expert_hidden dim / 2, 8 heads (4 KV heads) at every width; the
smallest values keep every shard a multiple of 16 elements at TP 4 (Float8's kernels). A
`shard=uneven` point takes its sizes, then ModelArgs.uneven (ffn_hidden 2 x dim - 1), a
`tie` point ties them."""

SIZE_FRAGMENT = {"steps": "steps{}", "dim": "dim{}", "seq": "seq{}", "layers": "layers{}"}
SIZE_TOKEN = re.compile(r"^(steps|dim|seq|layers)(\d+)$")


def _size_rules(s: sc.Scenario, sizes: dict[str, int]) -> list[str]:
    """What SIZE_RULES refuse, as messages (a size at its default is always valid)."""
    out = []
    if "steps" in sizes and (s.shapes != "static" or s.resume != "none"):
        out.append("steps sets a static, non-resumed run's length (varlen and resume rows keep their own schedule)")
    if "seq" in sizes and s.shapes != "static":
        out.append("seq is the static sequence length (a varlen row has its own lengths)")
    if "layers" in sizes and s.parallel == "pp":
        out.append("a pp row has one block per stage: layers stays at the table's for parallel=pp")
    if sizes and s.loss_scaled:
        out.append("an mp=fp16 row keeps the table's sizes: its loss spike overflows float16 at them "
                   "(suites/runner/step.py SPIKE is measured there; step 1 is the spike's)")
    return out


AXES: tuple[Axis, ...] = tuple(_axis(c) for c in sc.COLUMNS if c.axis) + SIZES
AXIS_VALUES = {a.name: a.values for a in AXES}
SIZE_DEFAULTS = {a.name: a.default for a in SIZES}


@dataclass(frozen=True)
class SizedScenario(sc.Scenario):
    """A table scenario with sizes off the table's defaults (`sizes`: (axis, value) pairs):
    its steps, model dims and sequence length follow them; its id ends in them."""

    sizes: tuple = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = _size_rules(self, dict(self.sizes))
        if problems:
            raise sc.ScenarioError(f"{self.id}: {'; '.join(problems)}")

    @property
    def size(self) -> dict[str, int]:
        return {**SIZE_DEFAULTS, **dict(self.sizes)}

    @property
    def id(self) -> str:
        return "-".join([super().id, *(SIZE_FRAGMENT[n].format(v) for n, v in self.sizes)])

    @property
    def base_model_args(self):
        base, size = super().base_model_args, self.size
        dim = size["dim"]
        return dataclasses.replace(base, dim=dim, ffn_hidden=2 * dim, max_seq_len=size["seq"],
                                   n_layers=base.n_layers if self.parallel == "pp" else size["layers"],
                                   expert_hidden=base.expert_hidden * dim // sc.MODEL.dim)

    @property
    def steps(self) -> int:
        return self.size["steps"] if "steps" in dict(self.sizes) else super().steps


def complete(point: Point) -> dict[str, Any]:
    """`point` with every missing axis at its default; an unknown axis or value is a ValueError."""
    names = [a.name for a in AXES]
    unknown = set(point) - set(names)
    if unknown:
        raise ValueError(f"unknown axis {', '.join(sorted(unknown))}; axes: {', '.join(names)}")
    full = {a.name: point.get(a.name, a.default) for a in AXES}
    for name, value in full.items():
        if value not in AXIS_VALUES[name] or type(value) is not type(AXIS_VALUES[name][0]):
            raise ValueError(f"{name}={value!r} is not a value of that axis; values: "
                             f"{', '.join(map(str, AXIS_VALUES[name]))}")
    return full


def problems(point: Point, device_type: str | None) -> list[str]:
    """Why a complete `point` cannot run on `device_type` (None: any accelerator); empty: it can."""
    try:
        s = scenario(point)
    except ValueError as exc:  # ScenarioError: the table's RULES
        return [str(exc)]
    out = []
    for kind, args, why in s.needs(device_type) if device_type else ():
        if kind == "skip" or (kind == "requires_accelerator" and device_type not in args):
            out.append(why)
    return out


def scenario(point: Point, tier: str = "nightly") -> sc.Scenario:
    """The Scenario of a (complete or partial) point: a plain table Scenario when every size is
    at its default, else a SizedScenario; ScenarioError when the RULES or SIZE_RULES refuse it."""
    columns = {a.name: point.get(a.name, a.default) for a in AXES if a.name not in SIZE_DEFAULTS}
    sizes = tuple((a.name, point[a.name]) for a in SIZES if point.get(a.name, a.default) != a.default)
    row = sc.Scenario.from_dict({**columns, "tier": tier})
    return SizedScenario(**row.as_dict(), sizes=sizes) if sizes else row


def point_of(row: sc.Scenario) -> dict[str, Any]:
    """A table row (or a SizedScenario) as a point of the space (every axis, defaults included)."""
    sizes = row.size if isinstance(row, SizedScenario) else SIZE_DEFAULTS
    return {a.name: sizes[a.name] if a.name in SIZE_DEFAULTS else getattr(row, a.name) for a in AXES}


def key(point: Point) -> str:
    """A point's identity: its scenario id (every non-default axis is in it)."""
    return scenario(point).id


def point_from_id(sid: str) -> dict[str, Any]:
    """The point whose scenario id is `sid` (the inverse of `key`), so a fuzz test id alone,
    `suites/fuzz_entry.py::test_fuzz_config[<id>]`, names its configuration (a rerun, a
    bisect probe). ValueError when no valid point has that id."""
    options: dict[str, list[dict[str, Any]]] = {}
    for c in sc.COLUMNS:
        if not c.axis or c.fragment is None or callable(c.fragment):
            continue
        for v in c.values:
            if v != c.default:
                token = c.fragment.get(v, str(v)) if isinstance(c.fragment, dict) else c.fragment.format(v)
                options.setdefault(token, []).append({c.name: v})
    for compile_ in AXIS_VALUES["compile"]:
        for backend in AXIS_VALUES["backend"]:
            probe = {"compile": compile_, "backend": backend}
            if (compile_ == "none") == (backend == "none"):
                token = next(p for c in sc.COLUMNS if c.name == "compile"
                             for p in [c.fragment(type("S", (), probe)())])
                options.setdefault(token, []).append(probe)
    tokens = sid.split("-")
    sizes: dict[str, int] = {}
    while tokens and SIZE_TOKEN.match(tokens[-1]):
        name, value = SIZE_TOKEN.match(tokens.pop()).groups()
        sizes[name] = int(value)
    unknown = [t for t in tokens if t not in options]
    if unknown:
        raise ValueError(f"{sid!r} is no scenario id: {', '.join(unknown)} is no column's fragment")
    for choice in _product([options[t] for t in tokens]):
        point: dict[str, Any] = dict(sizes)
        for part in choice:
            point.update(part)
        try:
            if key(point) == sid:
                return {a.name: point.get(a.name, a.default) for a in AXES}
        except ValueError:
            continue
    raise ValueError(f"{sid!r} names no valid configuration (the table's rules refuse it)")


def _product(lists: list[list]) -> Iterable[tuple]:
    from itertools import product

    return product(*lists)
