"""The parts of a training step users configure: the loss, gradient clipping, the
optimizer with its parameter groups and LR schedule; and the step's machinery both runs
share (the global batches, `StepParts`, unscale, the optimizer's step, eval).

The single-process reference and the parallel run call these same functions, so a
difference between the two is the parallelism's doing. The forms are the ones
torchtitan 0.3 trains with: clipping at `max_norm` over every gradient (DTensor norms
made full, meshes combined), AdamW/SGD with weight decay off for norms and biases, a
linear warmup then cosine decay.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
# Every optimizer's __init__ imports Dynamo lazily (torch.optim's _disable_dynamo: ~2 CPU-s).
# Imported with this module it is in the rank template (the harness imports the test modules
# there before its first fork: the Warm message), so no test's fork imports it again.
import torch._dynamo  # noqa: F401
import torch.nn as nn
import torch.nn.functional as F

from ..scenario.model_args import ModelArgs
from ..scenario.record import BATCH, LR, SEED, Scenario
from .evidence import TrainRecord, clean_name, count_executed_ops

LABEL_SMOOTHING = 0.1
Z_LOSS_WEIGHT = 1e-2
"""Larger than PaLM's 1e-4 so the z-loss term moves the gradients measurably (a dropped
term must fail the comparison)."""
SOFT_LABEL_TEMPERATURE = 2.0
MAX_NORM = 0.5
"""Below the model's gradient norm in every step (measured 0.8 .. 2.5), so clipping
always scales: a clip that did nothing, or scaled by a wrong norm, changes the grads."""
MAX_NORM_INF = 0.02
"""The `inf` rows' max norm, below the largest |gradient| of every step: measured 0.031 ..
0.112 (torch 2.13.0 CPU references of fsdp, fsdp mp bf16 ga2, moe, pp 1f1b, tp z_loss, with
sgd and adamw, clipped at this value), so clipping always scales. MAX_NORM is 25x the
largest |gradient| and would never clip. LoRA's adapters peak at 0.005: a LoRA row with
clip inf would not scale, and the table has none."""
WEIGHT_DECAY = 0.1
WARMUP_STEPS = 1


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def soft_targets(labels: torch.Tensor, vocab: int) -> torch.Tensor:
    """A teacher's distribution for distillation: a peak at the label, the rest spread
    from a fixed function of the label (no RNG, identical on every rank)."""
    logits = torch.zeros(*labels.shape, vocab)
    logits.scatter_(-1, labels.unsqueeze(-1), 3.0)
    logits += torch.cos(torch.arange(vocab).float() * 0.37 + labels.unsqueeze(-1).float())
    return torch.softmax(logits / SOFT_LABEL_TEMPERATURE, dim=-1)


def _like(target: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The soft targets laid out as the logits are (a Shard(-1) DTensor under loss parallel)."""
    target = target.to(logits.device)
    if hasattr(logits, "placements"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(target, logits.device_mesh, logits.placements)
    return target


def loss_fn(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """(logits (B, S, V), labels (B, S)) -> the scalar loss of the `loss` column's kind.

    ce: cross entropy. smooth_ce: with label smoothing. soft_ce: cross entropy against a
    soft (teacher) distribution, written as distillation code writes it,
    -(target * log_softmax(logits)).sum(-1).mean(). z_loss: cross entropy plus
    weight * logsumexp(logits)^2 (PaLM's router/logit stabilizer).
    """
    def flat(logits: torch.Tensor) -> torch.Tensor:
        return logits.flatten(0, 1).float()

    if kind == "ce":
        return lambda logits, labels: F.cross_entropy(flat(logits), labels.flatten())
    if kind == "smooth_ce":
        return lambda logits, labels: F.cross_entropy(flat(logits), labels.flatten(), label_smoothing=LABEL_SMOOTHING)
    if kind == "soft_ce":
        def soft(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            x = flat(logits)
            target = _like(soft_targets(labels.flatten().cpu(), x.shape[-1]), x)
            return -(target * F.log_softmax(x, dim=-1)).sum(-1).mean()
        return soft
    if kind == "z_loss":
        def z(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            x = flat(logits)
            return F.cross_entropy(x, labels.flatten()) + Z_LOSS_WEIGHT * (torch.logsumexp(x, dim=-1) ** 2).mean()
        return z
    raise ValueError(f"unknown loss {kind!r}; known: ce, smooth_ce, soft_ce, z_loss")


def build_loss(scenario: Scenario) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The row's loss; compiled with the row's backend when `loss_compile` (torchtitan
    compiles the loss as one of its `compile.components`)."""
    fn = loss_fn(scenario.loss)
    if scenario.loss_compile:
        return torch.compile(fn, backend=scenario.backend)
    return fn


def _mesh_key(g: torch.Tensor) -> Any:
    mesh = getattr(g, "device_mesh", None)
    return None if mesh is None else (tuple(mesh.mesh.flatten().tolist()), mesh.mesh_dim_names)


def clip_grads(params: Iterable[torch.nn.Parameter], form: str, max_norm: float | None = None,
               local_params: Iterable[torch.nn.Parameter] = (), group: Any = None,
               local_norm: bool = False) -> torch.Tensor:
    """Clips the gradients to `max_norm` (default: MAX_NORM, MAX_NORM_INF for `inf`) in
    one of the forms users run; returns the total norm (a plain float32 tensor, the same
    on every rank).

    norm: torch.nn.utils.clip_grad_norm_ (foreach where the device has it).
    foreach: the same with foreach=True, as on CUDA by default.
    inf: the same with norm_type=inf: the largest |gradient| of all (DTensor gradients
    reduce their local maxima with Partial max placements).
    mesh: torchtitan's form for gradients on several meshes (EP, PP): one norm per mesh
    (get_total_norm, DTensor norms made full), combined as sqrt(sum of squares), then
    clip_grads_with_norm_. `local_params`: parameters whose gradients live on some ranks
    only (EP's experts here): their squared norms are summed over `group`. `inf` with
    local parameters takes this path too, combining by max (torchtitan's inf under PP:
    an all-reduce MAX over the pipeline ranks).
    `local_norm` is a mutation: the norm of each rank's local shards, never reduced.
    """
    params = [p for p in params if p.grad is not None]
    local_ids = {id(p) for p in local_params}
    norm_type = math.inf if form == "inf" else 2.0
    if max_norm is None:
        max_norm = MAX_NORM_INF if form == "inf" else MAX_NORM
    if local_norm:
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in (p.grad for p in params)]
        total = torch.nn.utils.get_total_norm(grads, norm_type=norm_type).float()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total.detach()
    if form in ("norm", "foreach", "inf") and not local_ids:
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type,
                                               foreach=True if form == "foreach" else None)
        return _plain(total).detach().float()
    if form not in ("norm", "foreach", "mesh", "inf"):
        raise ValueError(f"unknown clip form {form!r}; known: norm, foreach, mesh, inf")
    import torch.distributed as dist

    groups: dict[Any, list[torch.nn.Parameter]] = {}
    for p in params:
        groups.setdefault(("local",) if id(p) in local_ids else _mesh_key(p.grad), []).append(p)
    device = params[0].grad.device if params else torch.device("cpu")
    combined = torch.zeros((), dtype=torch.float32, device=device)  # a sum of squares, or a max
    for key, members in groups.items():
        part = _plain(torch.nn.utils.get_total_norm([p.grad for p in members], norm_type=norm_type)).float()
        part = part if norm_type == math.inf else part ** 2
        if key == ("local",):
            dist.all_reduce(part, op=dist.ReduceOp.MAX if norm_type == math.inf else dist.ReduceOp.SUM, group=group)
        combined = torch.maximum(combined, part) if norm_type == math.inf else combined + part
    total = combined if norm_type == math.inf else combined.sqrt()
    for members in groups.values():  # per mesh: a foreach multiply cannot mix DTensors and tensors
        torch.nn.utils.clip_grads_with_norm_(members, max_norm, total)
    return total.detach()


def _no_decay(name: str) -> bool:
    module = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
    return name.endswith("bias") or "norm" in module


def param_groups(named: Iterable[tuple[str, torch.nn.Parameter]], sched: str) -> list[dict]:
    """Trainable parameters, DTensor and plain ones in separate groups; with a schedule
    also weight decay for matrices and none for norms and biases (torchtitan's groups).

    The `tp` plan leaves the norms' weights plain tensors beside DTensor linears; the
    foreach kernels (the default on CUDA) cannot mix the two in one group. Grouping does
    not change the arithmetic, so a single-group reference stays comparable.
    """
    named = [(n, p) for n, p in named if p.requires_grad]
    keys: dict[tuple[bool, bool], list] = {}
    for name, p in named:
        decay = sched != "const" and not _no_decay(name)
        keys.setdefault((hasattr(p, "placements"), decay), []).append(p)
    out = []
    for (_, decay), params in keys.items():
        group: dict[str, Any] = {"params": params}
        if sched != "const":
            group["weight_decay"] = WEIGHT_DECAY if decay else 0.0
        out.append(group)
    return out


def warmup_cosine(step: int, total: int) -> float:
    """LR factor: linear warmup over WARMUP_STEPS, then cosine decay to 10% at `total`."""
    if step < WARMUP_STEPS:
        return (step + 1) / (WARMUP_STEPS + 1)
    progress = (step - WARMUP_STEPS) / max(1, total - WARMUP_STEPS)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


OPT_IMPL_KWARGS = {"default": {}, "for_loop": {"foreach": False}, "foreach": {"foreach": True},
                   "fused": {"fused": True}}
"""The torch.optim keyword that picks each `opt_impl`: `default` leaves the choice to torch as
users do (foreach for CUDA tensors, the loop for CPU ones); the others name it."""


def make_optimizer(named: Iterable[tuple[str, torch.nn.Parameter]], scenario: Scenario, impl: str | None = None
                   ) -> tuple[torch.optim.Optimizer, Any]:
    """(optimizer, LR scheduler or None) for the row's `optim`, `opt_impl` and `sched`
    columns; `impl` overrides `opt_impl` (the reference steps with the loop)."""
    groups = param_groups(named, scenario.sched)
    kwargs = OPT_IMPL_KWARGS[impl or scenario.opt_impl]
    if scenario.optim == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(groups, lr=LR["sgd"], **kwargs)
    else:
        opt = torch.optim.AdamW(groups, lr=LR["adamw"], weight_decay=0.01, **kwargs)
    if scenario.sched == "const":
        return opt, None
    total = scenario.steps
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: warmup_cosine(step, total))


SPIKE_STEP = 1
"""The step of an fp16 row where one microbatch spikes: the first microbatch of data-parallel
rank 0 (an outlier batch) backpropagates SPIKE times its loss, so some of its scaled float16
gradients overflow. The other ranks' own gradients stay finite: they learn of the overflow
only through the gradient reduction, and their GradScaler must skip the step with rank 0's
(a rank that steps while another skips diverges for good)."""
SPIKE = 2.0 ** 9
"""Measured on torch 2.13.0 CPU (the references of the 13 fp16 rows, 2026-12-04): at 2**9
every row overflows, the accumulating rows (their microbatch loss halved) in 18-20
elements of 4 parameters only, the others in most parameters (as at 2**10 every row does).
A scaler that checks only its rank's own shards for inf was tried as a mutation on the
accumulating FSDP2 row and did not bite there: those elements reached both ranks' shards. At
2**8 the accumulating rows did not overflow with the spike in every microbatch. A stack
on which the spike stops overflowing fails its rows by name (checks.loss_scale_problems:
"the reference skipped no step"), never passes them silently."""
INIT_SCALE = 2.0 ** 12
"""GradScaler's first scale: below its default (2**16) so no step but the spike overflows
float16 at the model's gradient sizes (|g| < 1: 4096 |g| stays far below 65504)."""


def grad_scaler(scenario: Scenario, device_type: str, factory: Callable[..., Any] | None = None) -> Any:
    """torch.amp.GradScaler for a loss-scaled row (None otherwise); `factory` replaces the
    class (a mutation's scaler)."""
    if not scenario.loss_scaled:
        return None
    return (factory or torch.amp.GradScaler)(device_type, init_scale=INIT_SCALE, growth_interval=1000)


def scaled(loss: torch.Tensor, scaler: Any, step: int, first_microbatch: bool) -> torch.Tensor:
    """What backward runs on: the loss, scaled by the row's GradScaler; the global batch's
    first microbatch (data-parallel rank 0's first) spiked at SPIKE_STEP."""
    if scaler is None:
        return loss
    return scaler.scale(loss * SPIKE if step == SPIKE_STEP and first_microbatch else loss)


# The step's parts both runs share: the parallel run (training.py) and the reference
# (reference.py) build, unscale, step and evaluate through these same functions.

def batches(scenario: Scenario, seed: int = SEED) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batch of every step: BATCH rows per data-parallel rank and microbatch.

    From a private generator (identical on every rank). A TP-only row with one
    microbatch draws exactly what the table's first rows always drew.
    """
    args = scenario.model_args
    rows = BATCH * scenario.data_parallel_max * scenario.accum
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for step in range(scenario.steps):
        shape = (rows, scenario.seq_len(step))
        tokens = torch.randint(0, args.vocab_size, shape, generator=gen)
        labels = torch.randint(0, args.vocab_size, shape, generator=gen)
        out.append((tokens, labels))
    return out


def eval_batch(args: ModelArgs, seed: int = SEED) -> torch.Tensor:
    """The tokens an eval row evaluates on (a generator of their own, after training's)."""
    gen = torch.Generator().manual_seed(seed + 2)
    return torch.randint(0, args.vocab_size, (BATCH, args.max_seq_len), generator=gen)


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A DTensor made whole (full_tensor()); a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def loss_context(scenario: Scenario) -> Any:
    """loss_parallel() for a row that computes its loss over TP-sharded logits."""
    if not scenario.loss_parallel:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


@dataclass
class StepParts:
    """What every step of a run shares: the loss, the optimizer and its schedule."""

    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    opt: torch.optim.Optimizer
    sched: Any = None
    scaler: Any = None
    """torch.amp.GradScaler of a loss-scaled (fp16) row: it scales backward, unscales before
    the gradients are read, and steps (or skips) the optimizer."""
    watch: tuple[int, Counter] | None = None
    """(step, counter): count the ops that step's optimizer.step() executes into counter."""


def new_step_parts(scenario: Scenario, model: nn.Module, loss: Callable | None = None, impl: str | None = None,
                   scaler: Callable[..., Any] | None = None) -> StepParts:
    """The step's parts; `impl` overrides the row's optimizer implementation (the reference: the loop);
    `scaler`, a loss-scaled row's GradScaler factory (a mutation's)."""
    opt, sched = make_optimizer(((clean_name(n), p) for n, p in model.named_parameters()), scenario, impl)
    device_type = next(model.parameters()).device.type
    return StepParts(loss or build_loss(scenario), opt, sched, grad_scaler(scenario, device_type, scaler))


def unscale(parts: StepParts) -> None:
    """A loss-scaled step's gradients divided by the scale (and checked for inf) before
    anything reads them, as users unscale before clipping."""
    if parts.scaler is not None:
        parts.scaler.unscale_(parts.opt)


def optimizer_step(parts: StepParts, index: int | None = None, record: TrainRecord | None = None) -> None:
    """The optimizer's step (through the GradScaler of a loss-scaled row, which may skip it),
    then the schedule's; step `index`'s kernels counted when `parts.watch` names it."""
    watched = parts.watch is not None and parts.watch[0] == index
    with count_executed_ops(parts.watch[1]) if watched else contextlib.nullcontext():
        if parts.scaler is not None:
            parts.scaler.step(parts.opt)  # skipped when unscale_ found inf or nan
            parts.scaler.update()
            if record is not None:
                record.loss_scales.append(float(parts.scaler.get_scale()))
        else:
            parts.opt.step()
    if parts.sched is not None:
        parts.sched.step()
    if record is not None:
        record.lrs.append([float(group["lr"]) for group in parts.opt.param_groups])


def evaluate(scenario: Scenario, runnable: nn.Module, device, loss: Callable) -> tuple[float, torch.Tensor]:
    """An eval row's forward after training (no_grad or inference_mode): its loss and logits."""
    mode = torch.inference_mode() if scenario.eval == "inference" else torch.no_grad()
    tokens = eval_batch(scenario.model_args)
    gen = torch.Generator().manual_seed(SEED + 3)
    labels = torch.randint(0, scenario.model_args.vocab_size, tokens.shape, generator=gen)
    with mode, loss_context(scenario):
        logits = runnable(tokens.to(device))
        value = loss(logits, labels.to(device))
        return float(full_value(value).float().cpu()), full_value(logits).float().cpu().clone()
