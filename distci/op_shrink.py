"""What a smaller op case is: the case record's neighbourhood, and the greedy shrink over it.

Pure and torch-free, beside the case record (op_case.py) and the op inventory it reads, so
that both sides use one copy: the cell side (suites/generators/ops_entry.py) shrinks a
failing case inside its sweep, on the rank pool it already has (a shrink costs no pool
start), and the engine (distci/fuzz/ops.py) draws. Shrinking is greedy, first improvement,
toward the simplest case keeping the SAME signature: the 1-D mesh of 2, fewer dims, smaller
sizes, Replicate, float32, each parameter's first choice, seed 0. Candidates are ordered
biggest simplification first; the caller bounds checks and seconds.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from distci.op_case import MESHES, OpCase, meaningless
from distci.op_inventory import Arg, OpSpec, optionals, shapes_of, spec_of, variables


def norm_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d




def _handles(case: OpCase) -> tuple[dict[str, int], set[str]]:
    """The size variables and absent optional dims that rebuild `case`'s shapes (read back
    from the shapes when the case came from an id alone)."""
    spec = spec_of(case.op)
    if case.extra.get("sizes"):
        return dict(case.extra["sizes"]), set(case.extra.get("absent", ()))
    for absent_n in range(len(optionals(spec)) + 1):
        for absent in _subsets(optionals(spec), absent_n):
            sizes = _solve(spec, case.shapes, set(absent), case.param)
            if sizes is not None:
                return sizes, set(absent)
    raise ValueError(f"case {case.id}: its shapes do not fit {case.op}'s templates")


def _subsets(items: list[str], n: int) -> Iterator[tuple[str, ...]]:
    if n == 0:
        yield ()
        return
    for i, item in enumerate(items):
        for rest in _subsets(items[i + 1:], n - 1):
            yield (item, *rest)


def _solve(spec: OpSpec, shapes: tuple[tuple[int, ...], ...], absent: set[str],
           params: dict[str, Any]) -> dict[str, int] | None:
    sizes: dict[str, int] = {c.partition(":")[2]: params[k] for k, c in spec.params.items()
                             if isinstance(c, str) and c.startswith("var:") and k in params}
    for arg, shape in zip(spec.args, shapes):
        tokens = [t for t in arg.dims.split() if not (t.endswith("?") and t[:-1] in absent)]
        if len(tokens) != len(shape):
            return None
        for token, n in zip(tokens, shape):
            parts = token.rstrip("?").split("*")
            if len(parts) == 1 and not parts[0].isdigit():
                if sizes.setdefault(parts[0], n) != n:
                    return None
    for arg, shape in zip(spec.args, shapes):  # products: the one unknown part
        tokens = [t for t in arg.dims.split() if not (t.endswith("?") and t[:-1] in absent)]
        for token, n in zip(tokens, shape):
            parts = token.rstrip("?").split("*")
            known = 1
            unknown = [p for p in parts if not p.isdigit() and p not in sizes]
            for p in parts:
                known *= int(p) if p.isdigit() else sizes.get(p, 1)
            if unknown:
                sizes[unknown[0]] = n // known if known else 0
    for v in variables(spec):
        sizes.setdefault(v, max(spec.mins.get(v, 0), 1))
    return sizes if shapes_of(spec, sizes, absent) == tuple(shapes) else None


def _rebuild(case: OpCase, sizes: dict[str, int], absent: set[str], **changes: Any) -> OpCase | None:
    spec = spec_of(case.op)
    shapes = shapes_of(spec, sizes, absent)
    placements = changes.get("placements", case.placements)
    old_absent = _handles(case)[1]
    if absent != old_absent:
        placements = tuple(_remap(p, arg, old_absent, absent) for p, arg in zip(placements, spec.args))
    params = tuple((k, sizes[spec.params[k].partition(":")[2]]
                    if str(spec.params.get(k, "")).startswith("var:") else v)
                   for k, v in changes.get("params", case.params))
    if shapes != case.shapes and any(isinstance(spec.params.get(k), str) for k, _ in params):
        params = tuple((k, _fit_dim(v, spec.params[k], shapes) if str(spec.params.get(k)).startswith("dim") else v)
                       for k, v in params)
    out = OpCase(case.op, changes.get("mesh", case.mesh), changes.get("dtype", case.dtype), shapes, placements,
                 params, changes.get("seed", case.seed), {"sizes": sizes, "absent": sorted(absent)})
    return out if valid(out) else None


def _remap(placement: tuple[str, ...], arg: Arg, old_absent: set[str], new_absent: set[str]) -> tuple[str, ...]:
    """A placement after optional dims were dropped: a Shard of a dropped dim becomes R,
    later dims move down (negative dims count from the end and keep their meaning)."""
    def kept(absent: set[str]) -> list[str]:
        return [t for t in arg.dims.split() if not (t.endswith("?") and t[:-1] in absent)]

    old, new = kept(old_absent), kept(new_absent)
    out = []
    for p in placement:
        m = re.match(r"^(S|SS)(-?\d+)$", p)
        if not m:
            out.append(p)
            continue
        token = old[int(m.group(2))]
        if token not in new:
            out.append("R")
        elif int(m.group(2)) < 0:
            out.append(p)
        else:
            out.append(f"{m.group(1)}{new.index(token)}")
    return tuple(out)


def _fit_dim(value: Any, choices: str, shapes: tuple[tuple[int, ...], ...]) -> Any:
    if value is None:
        return None
    ndim = len(shapes[int(choices.partition(":")[2])])
    return value if -ndim <= value < ndim else (-1 if ndim else 0)


def valid(case: OpCase) -> bool:
    """Whether every placement fits its input and mesh and some parallelism builds the layout
    (a shrink step may not invent one: op_case.meaningless)."""
    axes = len(MESHES[case.mesh][0])
    for shape, placement in zip(case.shapes, case.placements):
        if len(placement) != axes:
            return False
        for a, p in enumerate(placement):
            m = re.match(r"^(S|SS)(-?\d+)$", p)
            if m and not -len(shape) <= int(m.group(2)) < len(shape):
                return False
            if p.startswith("SS") and (a != 0 or axes != 2 or not placement[1].startswith("S")
                                       or norm_dim(int(placement[1][1:]), len(shape)) != int(p[2:])):
                return False
    return meaningless(case) is None


def simpler(case: OpCase) -> list[OpCase]:
    """Every one-step simplification of `case`, biggest first (deduplicated, all valid)."""
    spec = spec_of(case.op)
    sizes, absent = _handles(case)
    out: list[OpCase | None] = []
    if case.mesh == "2x2":  # drop an axis: keep tp's placements, or dp's
        out.append(_rebuild(case, sizes, absent, mesh="2", placements=tuple((p[1],) for p in case.placements)))
        out.append(_rebuild(case, sizes, absent, mesh="2", placements=tuple(
            (p[0].replace("SS", "S"),) for p in case.placements)))
    if case.mesh == "4":
        out.append(_rebuild(case, sizes, absent, mesh="2"))
    # the values before the sizes: a failure that needs one draw's values is a corner of them
    if case.seed != 0:
        out.append(_rebuild(case, sizes, absent, seed=0))
    if case.dtype != "f32" and "f32" in spec.dtypes:
        out.append(_rebuild(case, sizes, absent, dtype="f32"))
    for v in optionals(spec):
        if v not in absent:
            out.append(_rebuild(case, sizes, absent | {v}))
    for v in variables(spec):
        n, lo = sizes[v], spec.mins.get(v, 0)
        for smaller in sorted({max(lo, 1), n // 2, n - 1}):
            if max(lo, 1) <= smaller < n:  # never toward 0: an empty dim is a special case, not a simpler one
                out.append(_rebuild(case, {**sizes, v: smaller}, absent))
    for i, placement in enumerate(case.placements):
        for a, p in enumerate(placement):
            for q in _simpler_placements(p, len(case.shapes[i])):
                new = list(case.placements)
                new[i] = placement[:a] + (q,) + placement[a + 1:]
                if a == 1 and placement[0].startswith("SS"):  # the strided dp axis needs its tp Shard
                    new[i] = (placement[0][1:],) + new[i][1:]
                out.append(_rebuild(case, sizes, absent, placements=tuple(new)))
    for k, v in case.params:
        if k in spec.forms:  # a form shrinks to the plain one: out of the id
            out.append(_rebuild(case, sizes, absent, params=tuple((x, y) for x, y in case.params if x != k)))
            continue
        first = spec.params[k][0] if isinstance(spec.params[k], tuple) else None
        if isinstance(spec.params[k], tuple) and v != first:
            out.append(_rebuild(case, sizes, absent, params=tuple((x, first if x == k else y) for x, y in case.params)))
    seen, unique = {case.id}, []
    for c in out:
        if c is not None and c.id not in seen:
            seen.add(c.id)
            unique.append(c)
    return unique


def _simpler_placements(p: str, ndim: int) -> list[str]:
    if p == "R":
        return []
    if p == "Pavg":
        return ["R", "Psum"]
    if p.startswith("SS"):
        return ["R", p[1:]]
    if p.startswith("S-"):
        return ["R", f"S{int(p[1:]) + ndim}"]
    return ["R"]


@dataclass
class Shrunk:
    """A failing case and the smallest case found failing with the same signature."""

    found: OpCase
    signature: str
    case: OpCase
    message: str = ""
    steps: list[str] = field(default_factory=list)
    checks: int = 0
    complete: bool = True
    """False when a bound stopped shrinking: `case` fails the same way but may not be minimal."""


Check = Callable[[OpCase], "tuple[str | None, str]"]


def shrink(case: OpCase, signature: str, check: Check, *, max_checks: int = 400, max_s: float = 60.0,
           clock: Callable[[], float] = time.monotonic, message: str = "") -> Shrunk:
    """Greedy first-improvement shrinking: `check(case) -> (signature or None, message)`."""
    result = Shrunk(case, signature, case, message)
    start = clock()
    improved = True
    while improved:
        improved = False
        for candidate in simpler(result.case):
            if result.checks >= max_checks or clock() - start > max_s:
                result.complete = False
                return result
            result.checks += 1
            got, text = check(candidate)
            if got == signature:
                result.case, result.message = candidate, text
                result.steps.append(candidate.id)
                improved = True
                break
    return result
