"""What this stack can do, probed, never read off a version (DESIGN.md rule 9).

Every probe answers None (the stack can) or the reason it cannot, in words a skip line
can carry. A probe runs the smallest real call of the feature (or looks up the API it
needs), once per process: < 50 ms, no compile, no collective. Rows run or skip by
`missing(scenario, device_type)`; regression tests ask the single probes.

Versions lie in both directions: torch 2.11's CPU `_scaled_mm` takes tensorwise scales
only ("Now _scaled_mm only supports per-tensor scaling for CPU backend") while 2.13's
takes rowwise ones; a source build or a backport has what its version number does not
say.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from ..scenario.record import PP_LAYOUTS

@functools.cache
def torchao() -> str | None:
    if importlib.util.find_spec("torchao") is None:
        return "Float8 needs torchao, which this cell does not install"
    return None


@functools.cache
def scaled_mm(device_type: str, scaling: str) -> str | None:
    """Whether `torch._scaled_mm` runs float8 e4m3 with `tensorwise` or `rowwise` scales here."""
    import torch

    if not hasattr(torch, "float8_e4m3fn"):
        return "this torch has no float8_e4m3fn dtype"
    if device_type == "cuda":
        return None  # CUDA's kernels are chosen by SM: the requires_sm markers say which
    try:
        a = torch.zeros(16, 16, device=device_type).to(torch.float8_e4m3fn)
        if scaling == "rowwise":
            sa, sb = torch.ones(16, 1, device=device_type), torch.ones(1, 16, device=device_type)
        else:
            sa = sb = torch.ones((), device=device_type)
        torch._scaled_mm(a, a.t(), sa, sb, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"this torch's {device_type} _scaled_mm takes no {scaling} scales ({first[:120]})"
    return None


@functools.cache
def differentiable_all_to_all() -> str | None:
    try:
        from torch.distributed import _functional_collectives as funcol
    except ImportError as exc:
        return f"expert parallel needs torch.distributed's functional collectives ({exc})"
    if not hasattr(funcol, "all_to_all_single_autograd"):
        return "expert parallel needs a differentiable all-to-all (all_to_all_single_autograd), which this torch lacks"
    return None


@functools.cache
def fsdp2_offload() -> str | None:
    for where in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            if hasattr(importlib.import_module(where), "CPUOffloadPolicy"):
                return None
        except ImportError:
            continue
    return "this torch's FSDP2 has no CPUOffloadPolicy"


@functools.cache
def fsdp2_gradient_sync() -> str | None:
    """grad_sync=last turns FSDP2's gradient reduction off for all microbatches but the last."""
    for where in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = importlib.import_module(where)
        except ImportError:
            continue
        if hasattr(getattr(module, "FSDPModule", None), "set_requires_gradient_sync"):
            return None
    return "this torch's FSDP2 has no FSDPModule.set_requires_gradient_sync"
def fsdp2_module_groups() -> str | None:
    """Whether FSDP2's fully_shard takes a list of modules as one unit (the tie rows' group
    of embedding, norm and output, as torchtitan shards a tied model). fully_shard's
    signature is hidden behind its `contract` decorator; the list form came with the helper
    that finds a list's root modules, which contract calls."""
    import torch.distributed.utils as dist_utils

    if hasattr(dist_utils, "_get_root_modules"):
        return None
    return "this torch's FSDP2 fully_shard takes one module, not a group (a tied model's embedding + output unit)"


@functools.cache
def dcp_async_save() -> str | None:
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError as exc:
        return f"no torch.distributed.checkpoint ({exc})"
    return None if hasattr(dcp, "async_save") else "this torch's DCP has no async_save"


@functools.cache
def clip_by_norm_parts() -> str | None:
    """torchtitan's per-mesh clipping needs get_total_norm and clip_grads_with_norm_."""
    import torch.nn.utils as utils

    missing = [n for n in ("get_total_norm", "clip_grads_with_norm_") if not hasattr(utils, n)]
    return f"this torch lacks torch.nn.utils.{' and '.join(missing)}" if missing else None


@functools.cache
def pipelining_schedule(schedule: str) -> str | None:
    """The pp row's schedule class is present in torch.distributed.pipelining."""
    from ..runner.pipeline import SCHEDULES

    try:
        from torch.distributed.pipelining import schedules
    except ImportError as exc:
        return f"no torch.distributed.pipelining ({exc})"
    name = SCHEDULES[schedule][0]
    return None if hasattr(schedules, name) else f"this torch's pipelining has no {name}"


@functools.cache
def fsdp2_gradient_divide_factor() -> str | None:
    """ep_fsdp divides its experts' reduction by the data-parallel size, as torchtitan does."""
    from ..runner.parallelize import fsdp_api

    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule
        except ImportError as exc:
            return f"this torch has no FSDP2 ({exc})"
    fsdp_api()
    if hasattr(FSDPModule, "set_gradient_divide_factor") or hasattr(FSDPModule, "set_reduce_scatter_divide_factor"):
        return None
    return "this torch's FSDP2 cannot set a gradient divide factor (experts on their own mesh need one)"


@functools.cache
def context_parallel() -> str | None:
    try:
        from torch.distributed.tensor.experimental import context_parallel as _  # noqa: F401
    except ImportError as exc:
        return f"this torch has no torch.distributed.tensor.experimental.context_parallel ({exc})"
    return None


@functools.cache
def composable_replicate(accumulates: bool) -> str | None:
    """torchtitan's DDP: `replicate` that takes a device_mesh (forwarded to DDP), and for
    grad_sync=last accumulation a way to skip the gradient sync (set_requires_gradient_sync)."""
    import inspect

    try:
        from torch.distributed._composable.replicate import DDP, replicate  # noqa: F401
        from torch.nn.parallel import DistributedDataParallel
    except ImportError as exc:
        return f"this torch has no composable replicate ({exc})"
    if "device_mesh" not in inspect.signature(DistributedDataParallel.__init__).parameters:
        return "this torch's DistributedDataParallel (under replicate) takes no device_mesh"
    if accumulates and not hasattr(DDP, "set_requires_gradient_sync"):
        return "this torch's replicate cannot skip the gradient sync (no set_requires_gradient_sync) for accumulation"
    return None


@functools.cache
def ddp_comm_hook(hook: str) -> str | None:
    """Whether DistributedDataParallel.register_comm_hook accepts the hook on this build:
    its own check, run without a process group (it reads the hook and the build only)."""
    import types

    from torch.nn.parallel import DistributedDataParallel

    from ..runner.parallelize import ddp_comm_hook as hook_of

    check = getattr(DistributedDataParallel, "_check_comm_hook", None)
    if check is None:
        return None  # registration itself will say

    def refuse(kind: type, message: str) -> None:
        raise kind(message)

    try:
        check(types.SimpleNamespace(_log_and_throw=refuse), hook_of(hook))
    except (TypeError, ValueError, RuntimeError) as exc:
        return f"this torch's DDP refuses the {hook} communication hook: {str(exc).strip()[:160]}"
    return None


@functools.cache
def optimizer_impl(device_type: str, optim: str, impl: str) -> str | None:
    """Whether torch.optim's `optim` (sgd | adamw) steps with `impl` (foreach | fused) on
    this device: one step of a 4-element parameter (fused CPU kernels came after CUDA's)."""
    import torch

    if impl in ("default", "for_loop") or device_type == "cuda":
        return None  # CUDA is where both kernels started (torch 2.0): no device work at collection
    cls = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[optim]
    try:
        p = torch.nn.Parameter(torch.ones(4, device=device_type))
        p.grad = torch.ones_like(p)
        cls([p], lr=0.1, **{impl: True}).step()
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"this torch's {cls.__name__} has no {impl} implementation on {device_type} ({first[:120]})"
    return None


@functools.cache
def full_state_dict_broadcast() -> str | None:
    """Whether torch.distributed.checkpoint.state_dict loads a full state dict that rank 0
    alone holds into a sharded model (StateDictOptions.broadcast_from_rank0)."""
    import dataclasses

    try:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict  # noqa: F401
    except ImportError as exc:
        return f"init=meta_load needs torch.distributed.checkpoint.state_dict ({exc})"
    if "broadcast_from_rank0" not in {f.name for f in dataclasses.fields(StateDictOptions)}:
        return "this torch's StateDictOptions has no broadcast_from_rank0: a full state dict cannot be loaded from rank 0"
    return None


@functools.cache
def dtensor_loss_scaling(device_type: str) -> str | None:
    """Whether torch.amp.GradScaler runs on this device and DTensor agrees its inf check
    across ranks: `_amp_foreach_non_finite_check_and_unscale_` on DTensor gradients all-reduces
    `found_inf` over their mesh (pytorch PR #132816, torch 2.5). Read off DTensor's table of
    op handlers; a torch that moved the table is taken to have it (a run then judges it)."""
    import torch

    try:
        torch.amp.GradScaler(device_type, init_scale=2.0)
    except (RuntimeError, TypeError, AttributeError, ValueError) as exc:
        return f"LAYOUT_amp needs torch.amp.GradScaler on {device_type} ({str(exc).strip()[:120]})"
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        from torch.distributed._tensor import DTensor
    handlers = getattr(getattr(DTensor, "_op_dispatcher", None), "_custom_op_handlers", None)
    if handlers is not None and torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default not in handlers:
        return "this torch's DTensor does not all-reduce GradScaler's found_inf (pytorch PR #132816, torch 2.5)"
    return None


@functools.cache
def fp16_loss_scaling(device_type: str) -> str | None:
    """Whether float16 matmuls run here and torch.amp.GradScaler scales, unscales and
    skips on this device (CPU got a GradScaler after CUDA)."""
    import torch

    try:
        w = torch.nn.Parameter(torch.ones(4, 4, device=device_type))
        scaler = torch.amp.GradScaler(device_type, init_scale=2.0)
        opt = torch.optim.SGD([w], lr=0.1)
        loss = (w.half() @ torch.ones(4, 4, device=device_type, dtype=torch.float16)).float().sum()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"mp=fp16 needs float16 matmuls and torch.amp.GradScaler on {device_type} ({first[:120]})"
    return None


def missing(scenario: Any, device_type: str) -> list[str]:
    """Why this stack cannot run `scenario` on `device_type` (empty: it can)."""
    reasons = []
    if scenario.float8 != "none":
        reasons.append(torchao())
        recipe = "tensorwise" if scenario.float8 == "tensorwise" else "rowwise"
        reasons.append(scaled_mm(device_type, recipe))
    if scenario.parallel in ("ep", "ep_fsdp"):
        reasons.append(differentiable_all_to_all())
    if scenario.parallel == "ep_fsdp":
        reasons.append(fsdp2_gradient_divide_factor())
    if scenario.parallel == "cp":
        reasons.append(context_parallel())
    if scenario.parallel == "replicate":
        reasons.append(composable_replicate(scenario.grad_sync == "last"))
    if scenario.ddp_hook != "none":
        reasons.append(ddp_comm_hook(scenario.ddp_hook))
    if scenario.offload:
        reasons.append(fsdp2_offload())
    if scenario.grad_sync != "every":
        reasons.append(fsdp2_gradient_sync())
    if scenario.tie and (scenario.fsdp or scenario.resume == "fsdp"):
        reasons.append(fsdp2_module_groups())
    if scenario.dcp == "async":
        reasons.append(dcp_async_save())
    if scenario.schedule != "none":
        reasons.append(pipelining_schedule(scenario.schedule))
    if scenario.clip == "mesh" or (scenario.clip == "inf" and scenario.parallel in ("ep", "ep_fsdp", *PP_LAYOUTS)):
        reasons.append(clip_by_norm_parts())  # inf over several meshes takes the per-mesh form
    if scenario.loss_scaled:
        reasons.append(fp16_loss_scaling(device_type))
    if scenario.init == "meta_load":
        reasons.append(full_state_dict_broadcast())
    reasons.append(optimizer_impl(device_type, scenario.optim, scenario.opt_impl))
    return list(dict.fromkeys(r for r in reasons if r))
