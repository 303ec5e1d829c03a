"""Evidence of the collectives a step ran: which call, in which dtype, on which group, how much.

Numbers alone cannot see precision routing: a gradient reduce-scatter that runs in bf16
where the MixedPrecisionPolicy says float32 is one more bf16 rounding (about 50 dB),
well inside a bf16 tolerance. So the runner records, during the last step's forward and
backward, every call of the torch.distributed functions FSDP2 issues its all-gathers and
reductions through, with the dtype of the tensor it moves, and checks.py compares them
with the policy.

Wrapping the module functions (not a TorchDispatchMode): FSDP2 calls them by module
attribute (`dist.all_gather_single`, `dist.reduce_scatter_tensor`, ... the names moved
between releases, every known one is wrapped), from hooks Dynamo does not trace; and a
dispatch mode active around a compiled model makes its frames run eager (measured: the
FSDP2 whole-model-compile rows ran their last step with 0 compiled graphs).

TP's collectives and every DTensor redistribute (FSDP2-over-TP's included) go through the
functional collectives' Python entry points instead (`funcol.all_gather_tensor`,
`funcol.reduce_scatter_tensor`, `funcol.all_reduce`, ...: DTensor calls them by module
attribute too), so those are wrapped the same way and recorded as `funcol.<name>`, apart
from FSDP2's c10d calls. Inside a Dynamo trace a wrapper records nothing and only calls
through (`torch.compiler.is_compiling()` is a constant to Dynamo: no side effect, no graph
break, the frame still compiles); what a compiled graph runs is seen at run time by the
profiler instead (evidence.count_executed_ops: `_c10d_functional::*` by name). A compiled
row records the c10d functions only (`functional=False`), a precaution not measured either way.
Each call is also kept as a CollectiveCall (op, dtype, group, elements) when asked: the
group is the mesh dim's name where the caller passed (mesh, dim), as DTensor does.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

import torch

FSDP_ALL_GATHER_OPS = ("all_gather_single", "all_gather_into_tensor", "_all_gather_base")
FSDP_REDUCE_SCATTER_OPS = ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")
FSDP_REDUCE_OPS = (*FSDP_REDUCE_SCATTER_OPS, "all_reduce")
"""Parameter all-gathers; gradient reductions (reduce-scatter, HSDP's all-reduce over the
replicas); FSDP2 issues one reduce-scatter per unit and gradient sync."""
FUNCTIONAL_OPS = ("all_gather_tensor", "all_gather_single", "reduce_scatter_single", "all_gather_tensor_autograd", "reduce_scatter_tensor",
                  "reduce_scatter_tensor_autograd", "all_reduce", "all_to_all_single", "all_to_all_single_autograd",
                  "broadcast", "permute_tensor", "all_reduce_coalesced", "all_gather_into_tensor_coalesced",
                  "reduce_scatter_tensor_coalesced")
"""torch.distributed._functional_collectives' entry points (DTensor's redistributes, TP,
expert all-to-alls); recorded as `funcol.<name>` (every name this torch has)."""
FUNCOL = "funcol."


@dataclass(frozen=True)
class CollectiveCall:
    """One recorded collective: `op` as the Counter keys it, the dtype and element count of
    the tensor it moves (its first tensor argument), and the group it ran on."""

    op: str
    dtype: str
    group: str
    numel: int


def group_name(group: Any) -> str:
    """The group as a reader names it: a mesh dim's name ((mesh, dim) as DTensor passes it, or
    a 1-D mesh), a process group's name, else its repr."""
    mesh, dim = (group if isinstance(group, tuple) and len(group) == 2 else (group, None))
    names = getattr(mesh, "mesh_dim_names", None)
    if names and isinstance(dim, int):
        return names[dim]
    if names and len(names) == 1:
        return names[0]
    if hasattr(mesh, "ndim"):
        return f"mesh_dim{dim if dim is not None else 0}"
    if hasattr(mesh, "group_name"):
        return str(mesh.group_name)
    return "default" if group is None else str(group)


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            return x
    return None


REDUCE_OPS = {"sum", "avg", "max", "min", "product", "premul_sum", "band", "bor", "bxor"}


def _group_arg(args: tuple, kwargs: dict) -> Any:
    """The group a call names: `group=`, else the first positional mesh, (mesh, dim) or
    process group, else a group name (a string that is not funcol's reduce op)."""
    if kwargs.get("group") is not None:
        return kwargs["group"]
    for a in args[1:]:
        if isinstance(a, tuple) or hasattr(a, "mesh_dim_names") or hasattr(a, "group_name"):
            return a
    names = [a for a in args[1:] if isinstance(a, str) and a and a.lower() not in REDUCE_OPS]
    return names[0] if names else None


@contextlib.contextmanager
def record_collectives(into: Counter, calls: list[CollectiveCall] | None = None,
                       functional: bool = True) -> Iterator[None]:
    """Counts (op, dtype name) of every wrapped torch.distributed and functional-collective
    call in the block (functional ones as `funcol.<name>`); `calls`: also each call's
    CollectiveCall, in order. `functional=False`: the c10d functions only, for a block that
    runs compiled code (see below).

    The originals are put back on exit, whatever happens inside.
    """
    import torch.distributed as dist

    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError:  # a torch without them: the c10d functions only
        funcol = None
    targets = [(dist, n, n) for n in (*FSDP_ALL_GATHER_OPS, *FSDP_REDUCE_OPS) if hasattr(dist, n)]
    targets += [(funcol, n, FUNCOL + n) for n in FUNCTIONAL_OPS if functional and funcol is not None
                and hasattr(funcol, n)]
    originals = [(module, attr, label, getattr(module, attr)) for module, attr, label in targets]
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
    inside = [0]

    def wrap(label: str, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if compiling() or inside[0]:  # traced into a graph (the profiler sees it run); or one entry
                return fn(*args, **kwargs)     # point calling another (a deprecated name): counted once
            t = _first_tensor(args, kwargs)
            dtype = str(t.dtype).replace("torch.", "") if t is not None else "-"
            into[(label, dtype)] += 1
            if calls is not None:
                calls.append(CollectiveCall(label, dtype, group_name(_group_arg(args, kwargs)),
                                            int(t.numel()) if t is not None else 0))
            inside[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                inside[0] -= 1
        return call

    try:
        for module, attr, label, fn in originals:
            setattr(module, attr, wrap(label, fn))
        yield
    finally:
        for module, attr, _, fn in originals:
            setattr(module, attr, fn)


def calls_of(collectives: Counter, ops: tuple[str, ...]) -> int:
    """How many of the recorded collectives' calls were one of `ops`."""
    return sum(dtypes_of(collectives, ops).values())


def dtypes_of(collectives: Counter, ops: tuple[str, ...]) -> Counter:
    """{dtype: calls} of the recorded collectives whose op is one of `ops`."""
    out: Counter = Counter()
    for (op, dtype), n in collectives.items():
        if op in ops:
            out[dtype] += n
    return out


def functional_dtypes(collectives: Counter) -> Counter:
    """{dtype: calls} of the functional collectives (TP's, DTensor's redistributes) recorded."""
    return dtypes_of(collectives, tuple(FUNCOL + n for n in FUNCTIONAL_OPS))
