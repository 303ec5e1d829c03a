"""Evidence of the collectives a step ran: which op, in which dtype, how often.

Numbers alone cannot see precision routing: a gradient reduce-scatter that runs in bf16
where the MixedPrecisionPolicy says float32 is one more bf16 rounding (about 50 dB),
well inside a bf16 tolerance. So the runner records, on the last step, every c10d and
functional collective with the dtype of the tensor it moves, and checks.py compares
them with the policy.

A TorchDispatchMode sees the c10d ops FSDP2 issues (`c10d::_allgather_base_`,
`c10d::_reduce_scatter_base_`, `c10d::allreduce_`) and DTensor's functional ones
(`_c10d_functional::*`) on every torch from 2.5, in forward and in backward. It is
entered after the first step, so no graph is traced under it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Iterator

import torch

FSDP_ALL_GATHER_OPS = ("c10d::_allgather_base_", "c10d::allgather_into_tensor_coalesced_")
FSDP_REDUCE_OPS = ("c10d::_reduce_scatter_base_", "c10d::reduce_scatter_tensor_coalesced_", "c10d::allreduce_")
"""The c10d ops FSDP2's parameter all-gathers and gradient reductions (reduce-scatter,
HSDP's all-reduce over the replicas) run as; TP's DTensor collectives are functional
(`_c10d_functional::`), so on a 2-D mesh the two stay apart."""


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    from torch.utils._pytree import tree_flatten

    for x in tree_flatten((args, kwargs))[0]:
        if isinstance(x, torch.Tensor):
            return x
    return None


@contextlib.contextmanager
def record_collectives(into: Counter) -> Iterator[None]:
    """Counts (op name, dtype name) of every collective run inside the block."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace in ("c10d", "_c10d_functional"):
                t = _first_tensor(args, kwargs)
                into[(func.name(), str(t.dtype).replace("torch.", "") if t is not None else "-")] += 1
            return func(*args, **kwargs)

    with _Recorder():
        yield


def dtypes_of(collectives: Counter, ops: tuple[str, ...]) -> Counter:
    """{dtype: calls} of the recorded collectives whose op is one of `ops`."""
    out: Counter = Counter()
    for (op, dtype), n in collectives.items():
        if op in ops:
            out[dtype] += n
    return out
