"""The configuration space the scenario table's rows are points of (the fuzzer draws and shrinks in it).

A point is one value per axis; an axis is a column of the scenario table (its ordered
values and its default, the value the id leaves out). Which combinations make sense is
written as data, `Rule`s of the form "when these axes take these values, those axes must
take those": an invalid draw is never run, and `Scenario`'s own constructor stays the
last word (a test holds the two in agreement). A point becomes a `Scenario` with
`scenario(point)`; every row of the fixed table is `point_of(row)`, a named point.

Importable without torch: the controller draws and shrinks here, the cell's environment
runs what it drew.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Iterable, Mapping

from . import scenarios as sc

Point = Mapping[str, Any]
"""axis name -> value; missing axes take their defaults."""


@dataclass(frozen=True)
class Axis:
    """One column: its values in order (shrinking walks toward `default`, then toward the
    front), and whether it is a size (a number the shrinker halves toward the default)."""

    name: str
    values: tuple
    default: Any
    size: bool = False

    def __post_init__(self) -> None:
        if self.default not in self.values:
            raise ValueError(f"axis {self.name}: default {self.default!r} is not one of {self.values}")


@dataclass(frozen=True)
class Rule:
    """When every `when` axis holds one of its values, every `then` axis must hold one of its values."""

    why: str
    when: Mapping[str, tuple]
    then: Mapping[str, tuple]

    def applies(self, point: Point) -> bool:
        return all(point[a] in vs for a, vs in self.when.items())

    def holds(self, point: Point) -> bool:
        return not self.applies(point) or all(point[a] in vs for a, vs in self.then.items())


COMPILED = ("model", "block")
BACKENDS = tuple(b for b in sc.BACKENDS if b != "none")
WORLD_SIZES = (2, 4)
ACCUMS = (1, 2, 4)

AXES: tuple[Axis, ...] = (
    Axis("parallel", sc.PARALLELS, "tp"),
    Axis("compile", sc.COMPILES, "none"),
    Axis("backend", sc.BACKENDS, "none"),
    Axis("ac", sc.ACS, "none"),
    Axis("float8", sc.FLOAT8S, "none"),
    Axis("async_tp", (False, True), False),
    Axis("world_size", WORLD_SIZES, 2, size=True),
    Axis("optim", sc.OPTIMS, "sgd"),
    Axis("model", sc.MODELS, "dense"),
    Axis("train", sc.TRAINS, "full"),
    Axis("shapes", sc.SHAPES, "static"),
    Axis("mp", sc.MPS, "none"),
    Axis("accum", ACCUMS, 1, size=True),
    Axis("eval", sc.EVALS, "none"),
    Axis("loss", sc.LOSSES, "plain"),
    Axis("resume", sc.RESUMES, "none"),
)

RULES: tuple[Rule, ...] = (
    Rule("a backend is named exactly when something is compiled", {"compile": ("none",)}, {"backend": ("none",)}),
    Rule("a compiled row names its backend", {"compile": COMPILED}, {"backend": BACKENDS}),
    Rule("async TP is inductor's pass over sequence-parallel TP", {"async_tp": (True,)},
         {"parallel": ("tp_sp", "fsdp_tp"), "compile": COMPILED, "backend": ("inductor",)}),
    Rule("mixed precision is FSDP2's MixedPrecisionPolicy", {"mp": ("bf16",)}, {"parallel": ("fsdp", "fsdp_tp")}),
    Rule("expert parallel needs the moe model", {"parallel": ("ep",)}, {"model": ("moe",)}),
    Rule("the MoE block has a TP plan for `tp` only", {"model": ("moe",)}, {"parallel": ("tp", "fsdp", "ep")}),
    Rule("loss parallel shards the logits over a TP dim", {"loss": ("parallel",)},
         {"parallel": ("tp", "tp_sp", "fsdp_tp")}),
    Rule("fsdp_tp is dp_shard x tp 2: four ranks", {"parallel": ("fsdp_tp",)}, {"world_size": (4,)}),
    Rule("the LoRA adapters exist on the dense model only", {"train": ("frozen",)}, {"model": ("dense",)}),
)


@dataclass(frozen=True)
class Space:
    """Axes (some restricted to fewer values) and the rules between them."""

    axes: tuple[Axis, ...] = AXES
    rules: tuple[Rule, ...] = RULES
    device_type: str | None = "cpu"
    """Points this accelerator cannot run (a `skip` need, another accelerator) are invalid
    here; None: any accelerator (the table's rows span all of them)."""
    fixed: Mapping[str, Any] = field(default_factory=dict)
    """Axes a restricted space holds at one value (not drawn, not shrunk)."""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    def complete(self, point: Point) -> dict[str, Any]:
        """`point` with every missing axis at its default; an unknown axis or value is a ValueError."""
        unknown = set(point) - set(self.names)
        if unknown:
            raise ValueError(f"unknown axis {', '.join(sorted(unknown))}; axes: {', '.join(self.names)}")
        full = {a.name: point.get(a.name, self.fixed.get(a.name, a.default)) for a in self.axes}
        for a in self.axes:
            if full[a.name] not in a.values and full[a.name] not in AXIS_VALUES[a.name]:
                raise ValueError(f"{a.name}={full[a.name]!r} is not a value of that axis; values: "
                                 f"{', '.join(map(str, AXIS_VALUES[a.name]))}")
        return full

    def problems(self, point: Point) -> list[str]:
        """Why `point` cannot run here (empty: it can)."""
        full = self.complete(point)
        out = [f"{r.why} ({_describe(r)})" for r in self.rules if not r.holds(full)]
        if out:
            return out
        try:
            s = scenario(full)
        except ValueError as exc:
            return [str(exc)]
        for kind, args, why in s.needs(self.device_type) if self.device_type else ():
            if kind == "skip" or (kind == "requires_accelerator" and self.device_type not in args):
                out.append(why)
        return out

    def valid(self, point: Point) -> bool:
        return not self.problems(point)

    def non_default(self, point: Point) -> dict[str, Any]:
        """The axes of `point` off their default: what a shrunk failure needs."""
        full = self.complete(point)
        return {a.name: full[a.name] for a in self.axes if full[a.name] != a.default}

    def restrict(self, values: Mapping[str, Iterable]) -> "Space":
        """A smaller space: each named axis keeps only `values[name]` (a one-value axis is fixed).
        A default left out moves to the first value kept."""
        axes = []
        fixed = dict(self.fixed)
        for a in self.axes:
            if a.name not in values:
                axes.append(a)
                continue
            keep = tuple(v for v in a.values if v in tuple(values[a.name]))
            wrong = [v for v in values[a.name] if v not in a.values]
            if wrong or not keep:
                raise ValueError(f"--space {a.name}: {', '.join(map(str, wrong)) or 'no value'} not among "
                                 f"{', '.join(map(str, a.values))}")
            axes.append(Axis(a.name, keep, a.default if a.default in keep else keep[0], a.size))
            if len(keep) == 1:
                fixed[a.name] = keep[0]
        unknown = set(values) - set(self.names)
        if unknown:
            raise ValueError(f"--space: unknown axis {', '.join(sorted(unknown))}; axes: {', '.join(self.names)}")
        return Space(tuple(axes), self.rules, self.device_type, fixed)


AXIS_VALUES = {a.name: a.values for a in AXES}


def _describe(rule: Rule) -> str:
    when = ", ".join(f"{a}={'|'.join(map(str, vs))}" for a, vs in rule.when.items())
    then = ", ".join(f"{a}={'|'.join(map(str, vs))}" for a, vs in rule.then.items())
    return f"{when} needs {then}"


def scenario(point: Point, tier: str = "nightly") -> sc.Scenario:
    """The Scenario of a (complete or partial) point; ValueError when the table's own rules refuse it."""
    full = {a.name: point.get(a.name, a.default) for a in AXES}
    return sc.Scenario(tier=tier, **full)


def point_of(row: sc.Scenario) -> dict[str, Any]:
    """A table row as a point of the space (every axis, defaults included)."""
    return {a.name: getattr(row, a.name) for a in AXES}


def key(point: Point) -> str:
    """A point's identity: its scenario id (every non-default axis is in it)."""
    return scenario(point).id


# --- drawing ---------------------------------------------------------------------------------

Pair = tuple[tuple[str, Any], tuple[str, Any]]


def pairs_of(space: Space, point: Point) -> set[Pair]:
    """Every pair of (axis, value) the point covers, over the drawn (non-fixed) axes."""
    full = space.complete(point)
    drawn = [a.name for a in space.axes if a.name not in space.fixed]
    return {((a, full[a]), (b, full[b])) for a, b in combinations(drawn, 2)}


@dataclass
class Drawer:
    """Deterministic draws from a seed, biased toward (axis, value) pairs not yet tried.

    Each draw samples `candidates` valid points (each axis at its default with probability
    `p_default`, else a uniform other value; invalid samples are redrawn) and keeps the one
    covering the most untried pairs, ties going to the earliest. The stream depends only on
    the seed, the space and what was drawn before, never on outcomes or timing, so the same
    seed replays the same list (a shorter budget gives a prefix of it).
    """

    space: Space
    seed: str
    candidates: int = 24
    p_default: float = 0.5
    tried: set[Pair] = field(default_factory=set)
    drawn: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"distci-fuzz:{self.seed}")

    def _sample(self) -> dict[str, Any] | None:
        for _ in range(400):
            point = {}
            for a in self.space.axes:
                if a.name in self.space.fixed or len(a.values) == 1:
                    point[a.name] = self.space.fixed.get(a.name, a.values[0])
                    continue
                others = [v for v in a.values if v != a.default]
                point[a.name] = a.default if self.rng.random() < self.p_default else self.rng.choice(others)
            if self.space.valid(point):
                return point
        return None

    def draw(self) -> dict[str, Any] | None:
        """The next point never drawn before, or None when the space seems exhausted."""
        best, best_score = None, -1
        for _ in range(self.candidates):
            point = self._sample()
            if point is None or key(point) in self.drawn:
                continue
            score = len(pairs_of(self.space, point) - self.tried)
            if score > best_score:
                best, best_score = point, score
        if best is None:
            return None
        self.drawn.add(key(best))
        self.tried |= pairs_of(self.space, best)
        return best


# --- shrinking -------------------------------------------------------------------------------

def smaller(space: Space, point: Point) -> list[dict[str, Any]]:
    """The one-step simplifications of `point`, simplest first, each valid.

    For each axis off its default, in axis order: the axis back at its default; a size
    halfway toward it (4 -> 2 microbatches after 4 -> 1); another value an earlier one
    (parallel fsdp_tp -> fsdp). An axis whose reset breaks a
    rule takes the rule's dependents back to their defaults too (compile -> none resets
    the backend), when that makes the point valid. `space.fixed` axes never move.
    """
    full = space.complete(point)
    out: list[dict[str, Any]] = []
    seen = {key(full)}
    for a in space.axes:
        if a.name in space.fixed or full[a.name] == a.default:
            continue
        targets = [a.default]
        if a.size:
            between = [v for v in a.values if _between(v, a.default, full[a.name])]
            targets += sorted(between, key=lambda v: abs(v - a.default))
        else:  # toward the front: fsdp_tp -> fsdp before giving up on FSDP
            targets += [v for v in a.values[:a.values.index(full[a.name])] if v != a.default]
        for value in targets:
            candidate = _repaired(space, {**full, a.name: value}, moved=a.name)
            if candidate is not None and key(candidate) not in seen:
                seen.add(key(candidate))
                out.append(candidate)
    return out


def _between(v: Any, low: Any, high: Any) -> bool:
    return min(low, high) < v < max(low, high)


def _repaired(space: Space, point: dict[str, Any], moved: str) -> dict[str, Any] | None:
    if space.valid(point):
        return point
    fixed = dict(point)
    for _ in range(len(space.axes)):
        broken = [r for r in space.rules if not r.holds(fixed)]
        if not broken:
            break
        changed = False
        for r in broken:
            # turn off what needs the rule (its `when` side) before what it needs
            for axis in [*r.when, *r.then]:
                if axis != moved and axis not in space.fixed and fixed[axis] != space.axis(axis).default:
                    fixed[axis] = space.axis(axis).default
                    changed = True
                    break
        if not changed:
            return None
    return fixed if space.valid(fixed) else None
