"""The fuzzer's space: points, drawing and shrinking, over the axes the cell side declares.

A point is one value per axis. The axes, which points are valid and a point's id are the
cell side's (suites/space.py: the scenario table's columns and the fuzzer's sizes), loaded
from the checkout's suites by `cell_side`, so a column is declared once, there, and this
package (in the wheel, with no suites) carries no copy. What is generic lives here: a
space restricted to fewer values (`Space.restrict`), seeded draws biased toward untried
pairs (`Drawer`), and one-step simplifications toward the defaults (`smaller`).
"""

from __future__ import annotations

import dataclasses
import importlib
import random
import sys
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Iterable, Mapping

Point = Mapping[str, Any]
"""axis name -> value; missing axes take their defaults."""

CELL_SIDE = "suites.generators.space"


def cell_side(root: Path | str | None = None, module: str = CELL_SIDE) -> Any:
    """A cell-side declaration module (default: the scenario space, suites/generators/space.py) of the
    checkout at `root` (default: the working directory, where `distci fuzz` runs its suites
    from), loaded by name: the package never imports suites/ (it is not in the wheel).
    Importable without torch. A checkout without it is a ValueError naming the root."""
    root = Path(root or Path.cwd()).resolve()
    path = Path(*module.split(".")).with_suffix(".py")
    if not (root / path).is_file():
        raise ValueError(f"no {path.as_posix()} under {root}: distci fuzz draws over the checkout's cell side; "
                         "run it from the checkout whose suites the cells run")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(module)


@dataclass(frozen=True)
class Space:
    """The cell side's axes (some restricted to fewer values); validity is the table's RULES
    plus the device (`cell.problems`), a point's id the cell's (`cell.key`)."""

    cell: Any
    """The cell side: suites/space.py as `cell_side()` loads it."""
    device_type: str | None = "cpu"
    """Points this accelerator cannot run (a `skip` need, another accelerator) are invalid
    here; None: any accelerator (the table's rows span all of them)."""
    fixed: Mapping[str, Any] = field(default_factory=dict)
    """Axes a restricted space holds at one value (not drawn, not shrunk)."""
    axes: tuple = ()
    """The axes drawn from (default: all the cell side's), each the cell's `Axis` record."""

    def __post_init__(self) -> None:
        if not self.axes:
            object.__setattr__(self, "axes", tuple(self.cell.AXES))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    def axis(self, name: str) -> Any:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    def complete(self, point: Point) -> dict[str, Any]:
        """`point` with every missing axis at its default; an unknown axis or value is a ValueError."""
        unknown = set(point) - set(self.names)
        if unknown:
            raise ValueError(f"unknown axis {', '.join(sorted(unknown))}; axes: {', '.join(self.names)}")
        return self.cell.complete({a.name: point.get(a.name, self.fixed.get(a.name, a.default)) for a in self.axes})

    def problems(self, point: Point) -> list[str]:
        """Why `point` cannot run here (empty: it can)."""
        try:
            full = self.complete(point)
        except ValueError as exc:
            return [str(exc)]
        return self.cell.problems(full, self.device_type)

    def key(self, point: Point) -> str:
        """A point's identity: its scenario id (every non-default axis is in it)."""
        return self.cell.key(point)

    def valid(self, point: Point) -> bool:
        return not self.problems(point)

    def non_default(self, point: Point) -> dict[str, Any]:
        """The axes of `point` off their default (sizes included): what a shrunk failure needs."""
        full = self.complete(point)
        return {a.name: full[a.name] for a in self.cell.AXES if full[a.name] != a.default}

    def restrict(self, values: Mapping[str, Iterable]) -> "Space":
        """A smaller space: each named axis keeps only `values[name]` (a one-value axis is fixed).
        A default left out moves to the first value kept."""
        unknown = set(values) - set(self.names)
        if unknown:
            raise ValueError(f"--space: unknown axis {', '.join(sorted(unknown))}; axes: {', '.join(self.names)}")
        axes = []
        fixed = dict(self.fixed)
        for a in self.axes:
            if a.name not in values:
                axes.append(a)
                continue
            wanted = tuple(values[a.name])
            keep = tuple(v for v in a.values if v in wanted)
            wrong = [v for v in wanted if v not in a.values]
            if wrong or not keep:
                raise ValueError(f"--space {a.name}: {', '.join(map(str, wrong)) or 'no value'} not among "
                                 f"{', '.join(map(str, a.values))}")
            least = None if a.least is None else (a.least if a.least in keep else keep[0])
            default = a.default if a.default in keep else keep[0]
            axes.append(dataclasses.replace(a, values=keep, default=default, least=least))
            if len(keep) == 1:
                fixed[a.name] = keep[0]
        return Space(self.cell, self.device_type, fixed, tuple(axes))


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
        """A random valid point: each axis drawn, then, while the table's rules refuse the
        point, one drawn axis (in a random order) back at its default. Rejecting whole points
        instead would take ~100 tries per valid one with two dozen axes."""
        for _ in range(50):
            point = {}
            for a in self.space.axes:
                if a.name in self.space.fixed or len(a.values) == 1:
                    point[a.name] = self.space.fixed.get(a.name, a.values[0])
                    continue
                others = [v for v in a.values if v != a.default]
                point[a.name] = a.default if self.rng.random() < self.p_default else self.rng.choice(others)
            moved = [a for a in self.space.axes if point[a.name] != a.default and a.name not in self.space.fixed]
            self.rng.shuffle(moved)
            valid = self.space.valid(point)  # asked once per change: each ask builds a Scenario
            while not valid and moved:
                a = moved.pop()
                point[a.name] = a.default
                valid = self.space.valid(point)
            if valid:
                return point
        return None

    def draw(self) -> dict[str, Any] | None:
        """The next point never drawn before, or None when the space seems exhausted."""
        best, best_score = None, -1
        for _ in range(self.candidates):
            point = self._sample()
            if point is None or self.space.key(point) in self.drawn:
                continue
            score = len(pairs_of(self.space, point) - self.tried)
            if score > best_score:
                best, best_score = point, score
        if best is None:
            return None
        self.drawn.add(self.space.key(best))
        self.tried |= pairs_of(self.space, best)
        return best


# --- shrinking -------------------------------------------------------------------------------

def smaller(space: Space, point: Point) -> list[dict[str, Any]]:
    """The one-step simplifications of `point`, simplest first, each valid.

    For each axis off its default, in axis order: the axis back at its default; a size
    halfway toward it (4 -> 2 microbatches after 4 -> 1); another value an earlier one
    (parallel fsdp_tp -> fsdp). A move the table's rules refuse takes the fewest other
    axes back to their defaults with it (compile -> none resets the backend), when that
    makes the point valid. `space.fixed` axes never move.
    """
    full = space.complete(point)
    out: list[dict[str, Any]] = []
    seen = {space.key(full)}
    for a in space.axes:
        if a.name in space.fixed or full[a.name] == a.goal:
            continue
        targets = [a.goal]
        if a.size:  # the smallest first, then up toward the current value (halving, on these short lists)
            between = [v for v in a.values if _between(v, a.goal, full[a.name])]
            targets += sorted(between, key=lambda v: abs(v - a.goal))
        else:  # toward the front: fsdp_tp -> fsdp before giving up on FSDP
            targets += [v for v in a.values[:a.values.index(full[a.name])] if v != a.default]
        for value in targets:
            candidate = _repaired(space, {**full, a.name: value}, moved=a.name)
            if candidate is not None and space.key(candidate) not in seen:
                seen.add(space.key(candidate))
                out.append(candidate)
    return out


def _between(v: Any, low: Any, high: Any) -> bool:
    return min(low, high) < v < max(low, high)


def _repaired(space: Space, point: dict[str, Any], moved: str, most: int = 2) -> dict[str, Any] | None:
    """`point`, or the first valid point with up to `most` other axes back at their defaults
    (fewest first, in axis order), or None."""
    if space.valid(point):
        return point
    others = [a for a in space.axes if a.name != moved and a.name not in space.fixed and point[a.name] != a.default]
    for n in range(1, most + 1):
        for group in combinations(others, n):
            candidate = {**point, **{a.name: a.default for a in group}}
            if space.valid(candidate):
                return candidate
    return None
