"""torchtitan#864: Float8 rowwise + async TP: the fused scaled-matmul/reduce-scatter gets
a 3-D A with a 2-D A_scale.

Inductor's micro-pipeline TP pass turns `reshape -> _scaled_mm -> reshape ->
reduce_scatter` into `symm_mem.fused_scaled_matmul_reduce_scatter`. From torch 2.6 that
op wants a row-wise A_scale with A's leading dims, but the pass hands it the 3-D A from
before the first reshape together with the 2-D (M, 1) scale the matmul consumed:
"For row-wise scaling, the leading dims of A_scale must match the leading dims of A"
(ValueError from the op's meta function, raised as an InductorError while compiling).
torch 2.7 reshapes the scale back when the graph computes it as `reshape -> reciprocal`,
but not for `reciprocal -> reshape`; torch 2.8 passes the 2-D A with its reshapes kept
aside, and the bug is gone. torch 2.5's op still took a 2-D scale: no bug there.

The fix wraps the pass's `_insert_fused_matmul_reduce_scatter`: when the match is the
reshape pattern and A_scale is row-wise with fewer dims than A, it inserts
`reshape(A_scale, A.shape[:-1] + [1])` and hands that to the fused op, whatever order
produced the scale. Symbolic (dynamic) shapes are left alone.

detect(): the pass takes A from before the reshape (`match[0].args[0]`) and the fused
op's fallback demands A_scale's leading dims to match A's.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any, Callable

from distci_fixes.model import Applies, Fix
from distci_fixes.patching import lookup, patched_by, source_of, wrap

ID = "float8_asynctp_ac_scale"
_A_FROM_RESHAPE_INPUT = re.compile(r"A_node\s*=\s*cast\([^\n]*match\[0\]\.args\[0\]")
_SCALE_CONTRACT = "leading dims of A_scale"


def _static_shape(node: Any) -> Any:
    val = getattr(node, "meta", {}).get("val")
    if val is None or not hasattr(val, "shape"):
        return None, None
    shape = list(val.shape)
    return (val, shape) if all(type(d) is int for d in shape) else (None, None)


def _align_scale(graph: Any, matmul: Any) -> None:
    import torch

    if len(getattr(matmul, "nodes", ())) != 3 or not hasattr(matmul, "A_scale_node"):
        return
    # matmul.A_node may already be a fresh force_stride_order node without metadata; the
    # first reshape's input is the same 3-D A.
    _, a_shape = _static_shape(matmul.nodes[0].args[0])
    scale, s_shape = _static_shape(matmul.A_scale_node)
    if a_shape is None or s_shape is None or scale.numel() <= 1 or len(s_shape) >= len(a_shape):
        return
    lead = a_shape[:-1]
    rows = 1
    for d in lead:
        rows *= d
    if len(s_shape) != 2 or s_shape[0] != rows:
        return
    with graph.inserting_after(matmul.A_scale_node):
        node = graph.call_function(torch.ops.aten.reshape.default, (matmul.A_scale_node, lead + [s_shape[-1]]))
    try:
        node.meta["val"] = scale.reshape(lead + [s_shape[-1]])
    except Exception:
        pass  # Inductor's fake-tensor updater fills it in
    matmul.A_scale_node = node
    matmul.arg_ancestor_nodes.add(node)


def _aligning(original: Callable[..., Any]) -> Callable[..., Any]:
    def _insert_fused_matmul_reduce_scatter(graph: Any, matmul: Any, *args: Any, **kwargs: Any) -> Any:
        _align_scale(graph, matmul)
        return original(graph, matmul, *args, **kwargs)

    return _insert_fused_matmul_reduce_scatter


def detect(pass_module: ModuleType) -> bool:
    target = lookup(pass_module, "_insert_fused_matmul_reduce_scatter")
    if patched_by(target) == ID:
        return False
    from_match = lookup(pass_module, "_ScaledMatmul.from_match")
    if not _A_FROM_RESHAPE_INPUT.search(source_of(from_match)):
        return False
    import importlib

    symm_mem = importlib.import_module("torch.distributed._symmetric_memory")
    fallback = lookup(symm_mem, "_fused_scaled_matmul_reduce_scatter_fallback")
    return _SCALE_CONTRACT in source_of(fallback)


def apply(pass_module: ModuleType) -> None:
    wrap(pass_module, "_insert_fused_matmul_reduce_scatter", _aligning, ID)


FIX = Fix(
    id=ID,
    title="Float8 rowwise + async TP: fused scaled-matmul/reduce-scatter gets a 2-D A_scale for a 3-D A",
    upstream=(
        "https://github.com/pytorch/torchtitan/issues/864",
        "https://github.com/pytorch/pytorch/pull/148001",
    ),
    applies=Applies(releases=">=2.6,<2.8"),
    target="torch._inductor.fx_passes.micro_pipeline_tp",
    detect=detect,
    apply=apply,
    test="suites/regressions/test_torchtitan864_float8_asynctp_ac_scale.py",
)
