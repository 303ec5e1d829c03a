"""Float8 + async TP + sequence parallel: the fused scaled-matmul/reduce-scatter gives
each rank the wrong rows when the batch is larger than 1 (found by distci; no upstream
issue yet, see suites/regressions/test_asynctp_float8_sp_rows.py).

For torchao's `reshape(B*S, K) -> _scaled_mm -> reshape(B, S, N)` followed by a
reduce-scatter along the sequence (dim 1), inductor's micro-pipeline TP pass calls
`symm_mem.fused_scaled_matmul_reduce_scatter` with the 2-D A, `orig_scatter_dim=1` and
`scatter_dim_after_maybe_reshape=0`. The op chunks the 2-D A by rows, which are
batch-major, so rank r reduces batch chunk r and reads it as sequence chunk r: silently
wrong gradients (the pass fuses the backward of the column-parallel input), right only
for B == 1. torch 2.8 (where the op learned `scatter_dim_after_maybe_reshape`) through
2.14.1 share this code.

The fix wraps the op's Python implementation `_fused_scaled_matmul_reduce_scatter_impl`,
which the registered CUDA kernel calls by name: when A is the collapsed 2-D matrix of a
3-D+ output and the scatter dim was a middle one, it views A (and a row-wise A_scale)
with the output's leading dims again and scatters along the original dim, a layout the
implementation already handles. Every other call goes through unchanged.

detect(): the implementation chunks `A.movedim(scatter_dim_after_maybe_reshape, 0)` and
has no handling of a collapsed middle scatter dim.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any, Callable

from distci_fixes.model import Applies, Fix
from distci_fixes.patching import function_of, lookup, patched_by, source_of, wrap

ID = "asynctp_float8_sp_rows"
IMPL = "_fused_scaled_matmul_reduce_scatter_impl"
_BUGGY_CHUNKING = "A.movedim(scatter_dim_after_maybe_reshape, 0)"
_PARAMS = {"A", "A_scale", "orig_scatter_dim", "scatter_dim_after_maybe_reshape", "output_shape"}


def _collapsed_middle_dim(A: Any, orig: int, after: int, output_shape: Any) -> bool:
    if A.dim() != 2 or after != 0 or output_shape is None or len(output_shape) <= 2:
        return False
    if not 0 < orig < len(output_shape) - 1:
        return False
    lead = 1
    for d in output_shape[:-1]:
        lead *= int(d)
    return A.shape[0] == lead


def _unflattening(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)  # keeps the signature visible (inspect follows __wrapped__)
    def _fused_scaled_matmul_reduce_scatter_impl(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        arg = bound.arguments
        A, orig, shape = arg["A"], arg["orig_scatter_dim"], arg["output_shape"]
        if _collapsed_middle_dim(A, orig, arg["scatter_dim_after_maybe_reshape"], shape):
            lead = [int(d) for d in shape[:-1]]
            arg["A"] = A.reshape(*lead, A.shape[-1])
            scale = arg["A_scale"]
            if scale is not None and scale.numel() > 1:
                arg["A_scale"] = scale.reshape(*lead, scale.shape[-1])
            arg["scatter_dim_after_maybe_reshape"] = orig
        return original(*bound.args, **bound.kwargs)

    return _fused_scaled_matmul_reduce_scatter_impl


def detect(symm_mem: ModuleType) -> bool:
    impl = lookup(symm_mem, IMPL)
    if patched_by(impl) == ID:
        return False
    params = inspect.signature(function_of(impl)).parameters
    if not _PARAMS <= set(params):
        return False
    return _BUGGY_CHUNKING in source_of(impl)


def apply(symm_mem: ModuleType) -> None:
    wrap(symm_mem, IMPL, _unflattening, ID)


FIX = Fix(
    id=ID,
    title="Float8 + async TP + SP: fused scaled-matmul/reduce-scatter mixes up rows when batch > 1",
    upstream=(),
    applies=Applies(releases=">=2.8"),
    target="torch.distributed._symmetric_memory",
    detect=detect,
    apply=apply,
    test="suites/regressions/test_asynctp_float8_sp_rows.py",
)
