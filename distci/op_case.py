"""The op case: one DTensor operation on one mesh, with its inputs' sizes and placements.

A record (stdlib only): the ops engine (distci/fuzz/ops.py) draws and shrinks cases, the
cell side (suites/generators/ops_cases.py) runs them, and a case's id names it entirely,
so a find's test id (`suites/generators/ops_entry.py::test_op_case[<id>]`) reruns it with
nothing else. Vocabulary, as torchtitan's parallel_dims.py: an "axis" is a mesh axis, a
"dim" a tensor dimension.

The id: `op~mesh~dtype~shapes~placements~params~seed`, e.g.

    linear~2x2~f32~3x7,5x7~S0.R,R.S-1~bias=1~11

shapes and placements list one entry per tensor input (`s` is a 0-dim shape); a
placement lists one entry per mesh axis: `R` Replicate, `S<d>` Shard(d) (d may be
negative, as trainers write Shard(-1)), `Psum` / `Pavg` Partial, `SS<d>` _StridedShard(d)
with the split factor of the next axis (what FSDP2 over TP puts on the dp axis).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MESHES: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
    # as torchtitan's ParallelDims builds them: named axes, the tp axis innermost
    "2": ((2,), ("tp",)),
    "4": ((4,), ("dp_shard",)),
    "2x2": ((2, 2), ("dp_shard", "tp")),
}
"""mesh key -> (shape, axis names)."""

DTYPES = {"f32": "float32", "bf16": "bfloat16"}
PLACEMENT = re.compile(r"^(R|Psum|Pavg|S-?\d+|SS-?\d+)$")


class CaseIdError(ValueError):
    """A case id (or JSON) that does not describe a case: names the part that is wrong."""


def world_size(mesh: str) -> int:
    size = 1
    for n in MESHES[mesh][0]:
        size *= n
    return size


@dataclass(frozen=True)
class OpCase:
    op: str
    mesh: str
    """A key of MESHES."""
    dtype: str
    """A key of DTYPES (the floating inputs' dtype; index inputs are int64)."""
    shapes: tuple[tuple[int, ...], ...]
    placements: tuple[tuple[str, ...], ...]
    params: tuple[tuple[str, Any], ...] = ()
    seed: int = 0
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    """What drew the case (the size variables, optional dims): the shrinker's handles, not part of the id."""

    @property
    def id(self) -> str:
        shapes = ",".join("x".join(map(str, s)) if s else "s" for s in self.shapes)
        places = ",".join(".".join(p) for p in self.placements)
        params = ",".join(f"{k}={_text(v)}" for k, v in self.params) or "-"
        return "~".join([self.op, self.mesh, self.dtype, shapes, places, params, str(self.seed)])

    @property
    def param(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def world_size(self) -> int:
        return world_size(self.mesh)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "extra": self.extra}


def meaningless(case: OpCase) -> str | None:
    """Why no parallelism builds `case`'s layout, or None: the ops generator's RULES.

    A rule says what is meaningless, never what is broken upstream (a layout a parallelism
    does build and that fails is a known issue). One rule: a `_StridedShard` is FSDP2 over
    TP's layout, and FSDP2 shards a dim other than 0 only when the dp axis divides every tp
    shard of it (torch/distributed/fsdp/_fully_shard/_fsdp_param.py raises "FSDP does not
    support uneven sharding on dim N" otherwise), so an uneven strided shard on such a dim is
    a layout nobody has. On dim 0 FSDP2 builds it for any size (torch.chunk's chunks)."""
    for i, (shape, placement) in enumerate(zip(case.shapes, case.placements)):
        if why := meaningless_layout(shape, placement, case.mesh):
            return f"input {i}: {why}"
    return _not_loss_parallel(case)


def _not_loss_parallel(case: OpCase) -> str | None:
    """The second rule: an entry run under loss_parallel() (OpSpec.context) takes only the layout
    a loss-parallel run has, logits sharded on their class dim over one axis and targets placed as
    loss_parallel() derives them (torch/distributed/tensor/parallel/loss.py's contract); any other
    is not a loss-parallel run (its handlers refuse it by name)."""
    from distci.op_inventory import BY_NAME, loss_parallel_layout

    spec = BY_NAME.get(case.op)
    if spec is None or spec.context != "loss_parallel":
        return None
    axes = len(MESHES[case.mesh][0])
    dp = case.placements[0][0] if axes == 2 else "R"
    if dp in ("R", "S0") and case.placements == loss_parallel_layout(spec, axes, case.shapes, dp):
        return None
    return ("not a loss-parallel layout: loss_parallel() takes logits sharded on their class dim over "
            "the tp axis and its targets placed as it derives them")


def meaningless_layout(shape: tuple[int, ...], placement: tuple[str, ...], mesh: str) -> str | None:
    """`meaningless` for one input: its shape laid out with `placement` on `mesh`."""
    axes = MESHES[mesh][0]
    if len(axes) != 2 or not placement[0].startswith("SS"):
        return None
    dim = int(placement[0][2:])
    dim = dim + len(shape) if dim < 0 else dim
    if dim == 0 or not 0 <= dim < len(shape):
        return None
    dp, tp = axes
    uneven = [n for n in _chunk_sizes(shape[dim], tp) if n % dp]
    if not uneven:
        return None
    return (f"an uneven _StridedShard on dim {dim} (a tp shard of {uneven[0]} over dp {dp}): FSDP2 "
            "shards a dim other than 0 only evenly, so no parallelism builds it")


def _chunk_sizes(n: int, parts: int) -> list[int]:
    """The sizes torch.chunk gives each of `parts` ranks (0 where it runs out), as TP's Shard does."""
    size = -(-n // parts) if n else 0
    return [max(0, min(size, n - k * size)) for k in range(parts)]


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _value(text: str) -> Any:
    if text == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_case(text: str) -> OpCase:
    """An OpCase from its id (the inverse of OpCase.id)."""
    parts = text.strip().split("~")
    if len(parts) != 7:
        raise CaseIdError(f"case id {text!r}: write op~mesh~dtype~shapes~placements~params~seed (7 parts, got "
                          f"{len(parts)})")
    op, mesh, dtype, shapes, places, params, seed = parts
    if mesh not in MESHES:
        raise CaseIdError(f"case id {text!r}: mesh {mesh!r} is not one of {', '.join(MESHES)}")
    if dtype not in DTYPES:
        raise CaseIdError(f"case id {text!r}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    try:
        shape_list = tuple(() if s == "s" else tuple(int(n) for n in s.split("x")) for s in shapes.split(","))
    except ValueError:
        raise CaseIdError(f"case id {text!r}: shapes {shapes!r}: write sizes joined by x, inputs by ,") from None
    place_list = tuple(tuple(p.split(".")) for p in places.split(","))
    axes = len(MESHES[mesh][0])
    for p in place_list:
        if len(p) != axes or not all(PLACEMENT.match(x) for x in p):
            raise CaseIdError(f"case id {text!r}: placement {'.'.join(p)!r}: one of R, S<d>, SS<d>, Psum, Pavg "
                              f"per mesh axis ({axes})")
    if len(place_list) != len(shape_list):
        raise CaseIdError(f"case id {text!r}: {len(shape_list)} shapes but {len(place_list)} placements")
    kv = [] if params == "-" else [p.split("=", 1) for p in params.split(",")]
    if any(len(p) != 2 for p in kv):
        raise CaseIdError(f"case id {text!r}: params {params!r}: write k=v,k=v (or - for none)")
    try:
        seed_n = int(seed)
    except ValueError:
        raise CaseIdError(f"case id {text!r}: seed {seed!r} is not an integer") from None
    return OpCase(op, mesh, dtype, shape_list, place_list, tuple((k, _value(v)) for k, v in kv), seed_n)


def case_from_json(raw: dict[str, Any]) -> OpCase:
    case = parse_case(raw["id"])
    return OpCase(case.op, case.mesh, case.dtype, case.shapes, case.placements, case.params, case.seed,
                  dict(raw.get("extra") or {}))
