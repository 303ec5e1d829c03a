"""The ops generator's engine: draw op cases (their shrinking: distci/op_shrink.py).

Pure and torch-free: the cell side (suites/generators/ops_cases.py) runs a case and says
whether it fails and with what signature; this module decides what to run. A case is
drawn from a string seed and its index (random.Random over a string: the same stream on
every platform and Python), so a night's case list replays from the seed alone.

What a draw covers: every op of the inventory (distci/op_inventory.py), the meshes
trainers build (1-D of 2 and 4, 2-D dp_shard x tp), every placement a parallelism
produces on every input (Replicate; Shard on every dim, negative dims as trainers write
them; Partial sum and avg; _StridedShard on the dp axis over a tp Shard of the same dim,
FSDP2 over TP's layout, on dims other than 0 only where FSDP2 builds it: evenly, the RULE of
distci/op_case.py `meaningless`), and sizes over the whole small range: 0 and 1, sizes the mesh
does not divide, optional leading dims present or not.

Shrinking is the case record's neighbourhood (distci/op_shrink.py), beside the record so
the cell side shrinks inside its sweep without reaching up into this stage.
"""

from __future__ import annotations

import random
from typing import Any

from distci.op_case import MESHES, OpCase, meaningless_layout
from distci.op_inventory import ROUNDS, OpSpec, loss_parallel_layout, optionals, shapes_of, variables
from distci.op_shrink import norm_dim

SIZES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 7, 7, 8, 9, 11, 12, 13, 16)
"""Drawn sizes, weighted by repetition: small (cases stay fast), odd and prime ones the mesh
does not divide, 0 and 1 (empty shards, broadcast-like dims)."""
MESH_WEIGHTS = {"2": 5, "4": 2, "2x2": 4}
OPTIONAL_PRESENT = 0.6
PARTIAL_FREE = {"foreach_norm", "clip_grad_norm", "adamw_foreach", "sgd_foreach", "init_"}
"""Inputs that are parameters or their gradients at rest: no parallelism leaves them Partial."""


def _placement_choices(ndim: int, partial: bool) -> list[tuple[str, int]]:
    """(placement, weight) for one mesh axis of one input."""
    out = [("R", 7)]
    shards = [f"S{d}" for d in range(-ndim, ndim)]
    out += [(s, max(1, 9 // max(1, len(shards)))) for s in shards]
    if partial:
        out += [("Psum", 2), ("Pavg", 2)]
    return out


def _pick(rng: random.Random, weighted: list[tuple[Any, int]]) -> Any:
    return rng.choices([w[0] for w in weighted], weights=[w[1] for w in weighted])[0]


def draw_placements(rng: random.Random, spec: OpSpec, mesh: str, shapes: tuple[tuple[int, ...], ...]
                    ) -> tuple[tuple[str, ...], ...]:
    axes = len(MESHES[mesh][0])
    if spec.context == "loss_parallel":  # the one layout a TP run with loss parallel has
        return loss_parallel_layout(spec, axes, shapes, rng.choice(("R", "S0")) if axes == 2 else "R")
    out = []
    for arg, shape in zip(spec.args, shapes):
        partial = arg.kind in ("float", "pos") and spec.name not in PARTIAL_FREE
        choice = tuple(_pick(rng, _placement_choices(len(shape), partial)) for _ in range(axes))
        if axes == 2 and choice[1].startswith("S") and rng.random() < 0.25:
            # FSDP2 over TP: the dp axis shards the dim tp already shards, strided
            dim = norm_dim(int(choice[1][1:]), len(shape))
            strided = (f"SS{dim}", f"S{dim}")
            choice = choice if meaningless_layout(shape, strided, mesh) else strided
        out.append(choice)
    return tuple(out)


def _param_value(rng: random.Random, choices: tuple | str, shapes: tuple[tuple[int, ...], ...],
                 sizes: dict[str, int]) -> Any:
    if isinstance(choices, tuple):
        return rng.choice(choices)
    kind, _, index = choices.partition(":")
    if kind == "var":
        return sizes[index]
    ndim = len(shapes[int(index)])
    if kind == "dim?" and (ndim == 0 or rng.random() < 0.3):
        return None
    return rng.randrange(-ndim, ndim) if ndim else 0


def draw_case(seed: str, index: int, ops: list[OpSpec] | None = None, meshes: list[str] | None = None) -> OpCase:
    """The `index`-th case of `seed` (independent of every other index); `ops` and
    `meshes` narrow what is drawn (a quick run, a test)."""
    pool, stream = (ops, f"distci-ops:{seed}:{index}") if ops else _round_of(seed, index)
    rng = random.Random(stream)
    spec = rng.choice(pool)
    mesh = _pick(rng, [(m, w) for m, w in MESH_WEIGHTS.items() if not meshes or m in meshes])
    dtype = rng.choice(spec.dtypes)
    sizes = {v: max(spec.mins.get(v, 0), rng.choice(SIZES)) for v in variables(spec)}
    absent = {v for v in optionals(spec) if rng.random() >= OPTIONAL_PRESENT}
    shapes = shapes_of(spec, sizes, absent)
    placements = draw_placements(rng, spec, mesh, shapes)
    params = tuple((k, _param_value(rng, c, shapes, sizes)) for k, c in spec.params.items())
    seed_n = rng.randrange(1000)
    return OpCase(spec.name, mesh, dtype, shapes, placements, params + draw_forms(seed, index, spec), seed_n,
                  {"sizes": sizes, "absent": sorted(absent)})


def _round_of(seed: str, index: int) -> tuple[list[OpSpec], str]:
    """The inventory round a case draws its op from, and the stream it draws the rest from.

    Newest round first, each takes the case with its share of the entries seen up to it (a coin
    from a stream of its own), so every op is as likely as before and a case no later round took
    draws from the first round's stream exactly as it did before any widening: a widening moves
    only the indices it takes (tests/test_fuzz_ops_round2.py)."""
    base = f"distci-ops:{seed}:{index}"
    for n in range(len(ROUNDS) - 1, 0, -1):
        seen = sum(len(r) for r in ROUNDS[:n + 1])
        if random.Random(f"{base}:round{n}").random() < len(ROUNDS[n]) / seen:
            return list(ROUNDS[n]), f"{base}:round{n}:case"
    return list(ROUNDS[0]), base


def draw_forms(seed: str, index: int, spec: OpSpec) -> tuple[tuple[str, Any], ...]:
    """The case's forms (distci/op_inventory.py), from a stream of their own: the main stream,
    so every case drawn before a form existed, stays as it was; a plain form is left out of the id."""
    rng = random.Random(f"distci-ops:{seed}:{index}:forms")
    drawn = ((k, rng.choice(choices)) for k, choices in spec.forms.items())
    return tuple((k, v) for k, v in drawn if v != spec.forms[k][0])


def draw_cases(seed: str, start: int, count: int, ops: list[OpSpec] | None = None,
               meshes: list[str] | None = None) -> list[OpCase]:
    return [draw_case(seed, i, ops, meshes) for i in range(start, start + count)]
