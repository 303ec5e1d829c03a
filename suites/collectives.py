"""Evidence of the collectives a step ran: which c10d call, in which dtype, how often.

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
FSDP2 whole-model-compile rows ran their last step with 0 compiled graphs). TP's DTensor
collectives are functional ops, not these functions, so on a 2-D mesh FSDP2's stay apart.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from typing import Iterator

import torch

FSDP_ALL_GATHER_OPS = ("all_gather_single", "all_gather_into_tensor", "_all_gather_base")
FSDP_REDUCE_SCATTER_OPS = ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")
FSDP_REDUCE_OPS = (*FSDP_REDUCE_SCATTER_OPS, "all_reduce")
"""Parameter all-gathers; gradient reductions (reduce-scatter, HSDP's all-reduce over the
replicas); FSDP2 issues one reduce-scatter per unit and gradient sync."""


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            return x
    return None


@contextlib.contextmanager
def record_collectives(into: Counter) -> Iterator[None]:
    """Counts (function name, dtype name) of every wrapped torch.distributed call in the block.

    The originals are put back on exit, whatever happens inside.
    """
    import torch.distributed as dist

    originals = {n: getattr(dist, n) for n in (*FSDP_ALL_GATHER_OPS, *FSDP_REDUCE_OPS) if hasattr(dist, n)}

    def wrap(name: str, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            t = _first_tensor(args, kwargs)
            into[(name, str(t.dtype).replace("torch.", "") if t is not None else "-")] += 1
            return fn(*args, **kwargs)
        return call

    try:
        for name, fn in originals.items():
            setattr(dist, name, wrap(name, fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


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
