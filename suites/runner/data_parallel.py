"""Data parallel by replication: classic DistributedDataParallel and composable replicate
(torchtitan's apply_ddp), their communication hooks, buckets and gradient-sync contexts.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.nn as nn


def ddp_comm_hook(name: str) -> Callable | None:
    """The communication hook a ddp row registers (`ddp_hook` column), or None."""
    if name == "none":
        return None
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    return {"bf16": bf16_compress_hook}[name]


def apply_ddp(model: nn.Module, mesh: Any, bucket_cap_mb: float, static_graph: bool = False,
              find_unused_parameters: bool = False, hook: Callable | None = None) -> nn.Module:
    """Classic DistributedDataParallel over the mesh's group, as users wrap a model: the
    wrapper is what they call (and compile); the model keeps its parameter names. Gradients
    are averaged in buckets of `bucket_cap_mb` by the C++ reducer (or `hook`)."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, process_group=mesh.get_group(), bucket_cap_mb=bucket_cap_mb,
                                  static_graph=static_graph, find_unused_parameters=find_unused_parameters)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    return ddp


def apply_replicate(model: nn.Module, mesh: Any, bucket_cap_mb: float, compiled: bool,
                    find_unused_parameters: bool = False) -> None:
    """Composable DDP as torchtitan's `apply_ddp` applies it when dp_replicate > 1 without
    FSDP: Dynamo's DDPOptimizer when compiled, then `replicate(model, device_mesh=...)`.
    (torchtitan sets `optimize_ddp` globally; the caller patches it for the run.)"""
    from torch.distributed._composable.replicate import replicate

    kwargs = {"find_unused_parameters": True} if find_unused_parameters else {}
    replicate(model, device_mesh=mesh, bucket_cap_mb=bucket_cap_mb, **kwargs)


def ddp_of(runnable: nn.Module, model: nn.Module) -> Any:
    """The DistributedDataParallel instance behind a ddp or replicate layout."""
    from torch.nn.parallel import DistributedDataParallel

    inner = getattr(runnable, "_orig_mod", runnable)
    if isinstance(inner, DistributedDataParallel):
        return inner
    from torch.distributed._composable.replicate import replicate

    return replicate.state(model)._ddp


def ddp_buckets(ddp: Any) -> int:
    """Gradient buckets DDP's reducer holds now (it all-reduces each once a synchronized
    step; it rebuilds them after the first step, after the second under static_graph,
    which its logging data does not record: the reducer's own list is asked first)."""
    buckets = getattr(ddp.reducer, "_get_zeros_like_grad_buckets", None)
    if buckets is not None:
        return len(buckets())
    data = ddp._get_ddp_logging_data()
    sizes = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "")
    return len([s for s in sizes.split(",") if s.strip()])


def gradient_sync(runnable: nn.Module, model: nn.Module, parallel: str) -> Callable[[bool], Any]:
    """sync(on) -> a context for one microbatch: on=False skips the gradient all-reduce
    (DDP's no_sync(), replicate's set_requires_gradient_sync(False)): under grad_sync=last
    accumulation all-reduces once per step, in its last microbatch."""
    import contextlib

    if parallel == "ddp":
        ddp = getattr(runnable, "_orig_mod", runnable)
        return lambda on: contextlib.nullcontext() if on else ddp.no_sync()

    @contextlib.contextmanager
    def replicate_sync(on: bool):
        model.set_requires_gradient_sync(on)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return replicate_sync


def restoring_active_ddp_module() -> Any:
    """A context that puts DistributedDataParallel._active_ddp_module (what Dynamo asks
    to decide on DDPOptimizer) back on exit: a compiled DDP forward that raises, or a
    replicated one (replicate sets it in a forward pre-hook, clears it in the post-hook),
    leaves it set, and every later torch.compile in the rank's process would split its
    graphs for that stale module (suites/regressions/test_ddp_optimizer_first_bucket.py)."""
    import contextlib

    from torch.nn.parallel import DistributedDataParallel

    @contextlib.contextmanager
    def restore():
        before = DistributedDataParallel._get_active_ddp_module()
        try:
            yield
        finally:
            DistributedDataParallel._active_ddp_module = before

    return restore()
