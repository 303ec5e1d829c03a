"""Runs one training program (distci/training_program.py) twice, side by side in every rank:
parallelized as its layout says, and as the single-process reference (the same seed-built
model, the full global batch), comparing the two after every action.

Vocabulary: the **run** is the parallel model, its optimizer and scheduler; the **ref**
is the single-process copy; a **twin** holds one of them with what it needs to act (the
module it calls, its optimizer, scheduler, checkpoint). Every action is applied to both
twins (distci/training_program.py says what each does and which trainers make it); after each,
`compare` judges the loss (all-reduced over the data-parallel ranks, as trainers log it),
every gradient (while no no-sync accumulation is open), every parameter, the optimizer
state and LR, every rank's buffers, and which parameters require grad. The first action
with a problem ends the program: the failure names it (`at action N (name=arg)`), so a
find arrives localized to the call that diverged, and its first line is the signature
the shrinker keeps.

`compare` and the wording of a divergence live in program_judge.py.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from distci.training_program import AMP, CHECKPOINTED, FLOAT8, FSDP, part_of

from ..runner.evidence import clean_name
from . import program_checkpoint as checkpoint
from . import program_checkpointing as checkpointing
from . import program_float8 as float8
from . import program_hooks as hooks
from . import program_optimizers as optimizers
from . import program_precision as precision
from . import program_relayout as relayout
from . import program_scaler as scaler
from .program_layout import Parallel, accumulate_in_param_dtype, compile_blocks, fsdp_method, layout_model
from .program_judge import compare, placements
from .program_plants import Plant

SEED = 1234
ROWS = 4
"""Rows of the global batch per data-parallel rank."""
CLIP_VALUE = 0.01
"""clip=value's bound: below the larger gradients' entries, so it clips some and not all."""


class Block(nn.Module):
    def __init__(self, width: int, bias: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.w1 = nn.Linear(width, 2 * width, bias=bias)
        self.w2 = nn.Linear(2 * width, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.gelu(self.w1(self.norm(x))))


class Net(nn.Module):
    """Residual MLP blocks and a head, with a persistent buffer that training forwards move
    (as BatchNorm's num_batches_tracked or an EMA step count): a checkpoint must carry it.
    `checkpointing`: how a training forward calls each block, as transformers' models call
    `self._gradient_checkpointing_func(layer.__call__, ...)` (program_checkpointing.enable)."""

    checkpointing = None

    def __init__(self, width: int, layers: int, bias: bool = True) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, bias) for _ in range(layers))
        self.head = nn.Linear(width, width)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.seen.add_(1)
        for block in self.blocks:
            x = self.checkpointing(block.__call__, x) if self.checkpointing and self.training else block(x)
        return self.head(x) * (1 + 0.1 * torch.tanh(self.seen / 4))

    def generate(self, x: torch.Tensor, steps: int = 2) -> torch.Tensor:
        """A generate-style method (eval=generate): the blocks and the head called `steps` times
        on their own output, never through `forward` (as transformers' generate loops its decoder)."""
        for _ in range(steps):
            for block in self.blocks:
                x = block(x)
            x = self.head(x)
        return x


def schedule(step: int) -> float:
    """Linear warmup over 3 steps, then 0.8x a step: every scheduler step changes the LR."""
    return min((step + 1) / 3, 1.0) * 0.8 ** max(0, step - 2)


@dataclass
class Twin:
    """One side of the comparison."""

    model: nn.Module
    """The module whose parameters train (names as the full model's)."""
    runnable: nn.Module
    """What a forward calls (the model, its DDP wrapper, or either compiled)."""
    optim_name: str
    opt: Any = None
    sched: Any = None
    checkpoint: Any = None
    last_loss: float = math.nan
    scaling: Any = None
    """Its GradScaler, for a LAYOUT_amp program (program_scaler.py)."""
    ema: Any = None
    """Its EMA once a step=ema made it: an AveragedModel, or a Shadow under FSDP2 (program_hooks.py)."""
    named: dict[str, nn.Parameter] = field(default_factory=dict)
    """The parameters by name as the optimizer holds them, taken once after parallelizing:
    FSDP2 swaps the root's unsharded tensors in after a forward that no backward follows
    (an eval), and named_parameters() would then name those instead."""

    def new_optimizer(self) -> None:
        """The program's optimizer (program_optimizers.py) over the parameters that train."""
        self.opt = optimizers.make(self.optim_name, [p for p in self.named.values() if p.requires_grad])
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, schedule)


def batch(index: int, width: int, dp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of the `index`-th forward (the same on every rank)."""
    gen = torch.Generator().manual_seed(SEED + 1 + index)
    rows = ROWS * dp_size
    return torch.randn(rows, width, generator=gen), torch.randn(rows, width, generator=gen)


@dataclass
class Program:
    """A program being run: both twins, the layout, and what the comparison needs."""

    spec: Any
    """The distci.training_program.Program."""
    ref: Twin
    run: Twin
    par: Parallel
    plant: Plant = field(default_factory=Plant)
    forwards: int = 0
    unsynced: bool = False
    ref_grads: dict = field(default_factory=dict)
    run_grads: dict = field(default_factory=dict)
    losses: tuple[float, float] | None = None
    clip_totals: tuple[float, float] | None = None
    """(reference, run): the total norm each twin's clip_grad_norm_ returned at this action."""
    checkpoint_dir: str = ""
    pending_save: Any = None
    """The future of a save=async still writing (program_checkpoint.wait)."""
    async_group: Any = None
    """The process group of save=async (program_checkpoint._async_group)."""
    divided: bool = False
    """reshard=divide ran: FSDP2 sums gradients, the run divides its loss by the dp size."""
    precomputes: bool = False
    """step=precompute ran: float8 scales are precomputed after every step (program_float8.py)."""
    dist: Any = None
    """The harness's distributed context (meshes), for a load that lays the model out again."""


def build(spec: Any, layout: str, device_type: str) -> nn.Module:
    """The program's model before any layout: a float8 layout's converted first."""
    model = Net(spec.width, spec.layers, bias=layout not in float8.BIAS_FREE)
    if layout in FLOAT8:  # converted before it is parallelized, the reference alike
        float8.convert(model, device_type)
    return model


def start(spec: Any, dist: Any, plant: Plant, checkpoint_dir: str) -> Program:
    torch.manual_seed(SEED)
    ref_model = build(spec, spec.layout, dist.device_type)
    run_model = copy.deepcopy(ref_model)
    layout, kind = CHECKPOINTED.get(spec.layout, (AMP.get(spec.layout, spec.layout), ""))
    checkpointing.apply(ref_model, kind)  # the reference checkpoints as the run does (program_checkpointing.py)
    runnable, par = layout_model(run_model, layout, dist, kind)
    if plant.accumulates_in_param_dtype(spec.layout):
        accumulate_in_param_dtype(run_model)
    ref, run = Twin(ref_model, ref_model, spec.optim), Twin(run_model, runnable, spec.optim)
    for twin in (ref, run):
        twin.named = {clean_name(n): q for n, q in twin.model.named_parameters()}
        twin.new_optimizer()
        local = twin is run and plant.checks_inf_locally(spec.layout)
        twin.scaling = scaler.new(dist.device_type, local) if spec.layout in AMP else None
    return Program(spec, ref, run, par, plant, checkpoint_dir=checkpoint_dir, dist=dist)


def halves(x: torch.Tensor, dp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch's two halves for fwd_bwd=twice: every data-parallel rank's first
    ROWS // 2 rows, then the rest, so each rank's half of each is a contiguous block."""
    per_rank = x.reshape(dp_size, ROWS, *x.shape[1:])
    half = ROWS // 2
    return per_rank[:, :half].reshape(-1, *x.shape[1:]), per_rank[:, half:].reshape(-1, *x.shape[1:])


def _reference_loss(p: Program, x: torch.Tensor, y: torch.Tensor, twice: bool, spike: bool = False,
                    bad: torch.Tensor | None = None) -> torch.Tensor:
    """The reference's forward(s) and backward on the global batch (its two halves, one
    backward of their mean loss, for fwd_bwd=twice; rank 0's rows spiked for fwd_bwd=spike;
    against `bad`, the targets with a corrupt one, for fwd_bwd=badlabel), through its
    GradScaler if it trains with one. Returns the loss against the clean targets."""
    if p.par.layout == "fsdp_mp":
        return precision.mixed_precision_reference(p.ref.model, x, y, p.par.dp_size, ROWS, 2 if twice else 1)
    if p.par.layout in FLOAT8:  # the activations' float8 scales are per rank's rows
        return float8.per_rank_reference(p.ref.model, x, y, p.par.dp_size, ROWS, 2 if twice else 1)
    if not twice:
        out = p.ref.runnable(x)
        loss = F.mse_loss(out, y)
        if spike:
            scaler.backward(p.ref, scaler.reference_spike(out, y, p.par.dp_size, ROWS))
        else:
            scaler.backward(p.ref, loss if bad is None or bad is y else F.mse_loss(out, bad))
        return loss
    parts = zip(halves(x, p.par.dp_size), halves(y, p.par.dp_size))
    loss = sum(F.mse_loss(p.ref.runnable(xh), yh) for xh, yh in parts) / 2
    scaler.backward(p.ref, loss)
    return loss


def _forward_backward(p: Program, arg: str) -> None:
    """fwd_bwd=ARG on both twins. `noreduce` (hsdp): gradients reduce-scattered within each
    replica, their all-reduce across replicas left to the next synced backward
    (set_requires_all_reduce(False), FSDP2's HSDP accumulation)."""
    import torch.distributed as tdist

    sync, twice, spike = arg in ("sync", "twice", "noreduce", "spike", "badlabel", "inbwd"), arg == "twice", arg == "spike"

    x, y = batch(p.forwards, p.spec.width, p.par.dp_size)
    p.forwards += 1
    bad = scaler.bad_labels(y) if arg == "badlabel" else y
    ref_loss = _reference_loss(p, x, y, twice, spike, bad)
    if arg == "inbwd":
        hooks.step_after_backward(p.ref)
    rows = slice(p.par.dp_rank * ROWS, (p.par.dp_rank + 1) * ROWS) if p.par.dp_size > 1 else slice(None)
    ctx = contextlib.nullcontext()
    if p.par.layout == "ddp" and not sync:
        ctx = p.run.runnable.no_sync()
    elif p.par.layout in FSDP:
        p.run.model.set_requires_gradient_sync(sync)
        if p.par.layout == "hsdp":
            p.run.model.set_requires_all_reduce(arg != "noreduce")
    with ctx, hooks.stepping_in_backward(p.run) if arg == "inbwd" else contextlib.nullcontext():
        xr, yr = x[rows], y[rows]
        if twice:
            h = xr.shape[0] // 2
            loss = (F.mse_loss(p.run.runnable(xr[:h]).float(), yr[:h])
                    + F.mse_loss(p.run.runnable(xr[h:]).float(), yr[h:])) / 2
        else:
            out = p.run.runnable(xr).float()
            loss = F.mse_loss(out, yr)
        trained = loss if bad is y else F.mse_loss(out, bad[rows])
        scaled = trained / p.par.dp_size if p.divided else trained
        scaler.backward(p.run, scaled * scaler.SPIKE if spike and p.par.dp_rank == 0 else scaled)
    total = loss.detach().clone()
    if p.par.dp_size > 1:
        tdist.all_reduce(total, group=p.par.dp_group)
        total /= p.par.dp_size
    p.unsynced = arg in ("nosync", "noreduce")
    p.ref.last_loss, p.run.last_loss = float(ref_loss.detach()), float(total)
    p.losses = (p.ref.last_loss, p.run.last_loss)


def _eval(p: Program, mode: str) -> None:
    x, y = batch(10_000, p.spec.width, 1)
    guard = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    out = []
    for twin in (p.ref, p.run):
        twin.runnable.eval()
        with guard():
            if mode == "ema":  # on the EMA weights, as Lightning's callback swaps them in for validation
                with hooks.swapped_in(twin) as model:
                    at_bf16 = twin is p.ref and p.par.layout == "fsdp_mp"
                    out.append(float(F.mse_loss(precision.bf16_forward(model, x) if at_bf16 else model(x).float(), y)))
            elif mode == "generate":  # the model's own method, past DDP's wrapper and compile, as users call it
                model, xin = twin.model, x
                if twin is p.ref and p.par.layout == "fsdp_mp":  # at the run's precision
                    model, xin = copy.deepcopy(model).to(torch.bfloat16), x.to(torch.bfloat16)
                out.append(float(F.mse_loss(model.generate(xin).float(), y)))
            elif twin is p.ref and p.par.layout == "fsdp_mp":  # at the run's precision, as a forward is
                out.append(float(F.mse_loss(precision.bf16_forward(twin.model, x), y)))
            else:
                out.append(float(F.mse_loss(twin.runnable(x).float(), y)))
        twin.runnable.train()
    p.losses = (out[0], out[1])


def _freeze(p: Program, name: str, trainable: bool) -> None:
    """As Lightning's BaseFinetuning.freeze_module / make_trainable: through the module's
    parameters as they are registered now (under FSDP2 the unsharded ones while unsharded)."""
    for twin in (p.ref, p.run):
        module = twin.model.blocks[0] if name == "block0" else twin.model.head
        for param in module.parameters():
            param.requires_grad_(trainable)
            if not trainable:
                param.grad = None


def _add_param_group(p: Program, name: str) -> None:
    """As Lightning's BaseFinetuning.unfreeze_and_add_param_group: the part's parameters (as the
    optimizer holds parameters: the sharded ones) join the optimizer as a new param group at
    the first group's lr over 10 (its initial_denom_lr). The scheduler is made again over the
    new groups: torch's LRScheduler steps its groups with zip(strict=True) and refuses a group
    added after it was made (ValueError), reference and run alike."""
    prefix = "blocks.0." if name == "block0" else "head."
    for twin in (p.ref, p.run):
        params = [q for n, q in twin.named.items() if n.startswith(prefix)]
        twin.opt.add_param_group({"params": params, "lr": twin.opt.param_groups[0]["lr"] / 10})
        twin.sched = torch.optim.lr_scheduler.LambdaLR(twin.opt, schedule)


def _metric(p: Program, kind: str) -> None:
    import torch.distributed as tdist

    if kind == "barrier":
        tdist.barrier()
        return
    value = torch.tensor(p.run.last_loss if not math.isnan(p.run.last_loss) else 0.0)
    if p.par.dp_size > 1:
        tdist.all_reduce(value, group=p.par.dp_group)
        value /= p.par.dp_size
    p.losses = (p.ref.last_loss if not math.isnan(p.ref.last_loss) else 0.0, float(value))


def fresh_scheduler(opt: Any) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def apply(p: Program, name: str, arg: str) -> None:
    """One action on both twins."""
    p.losses = p.clip_totals = None
    if name == "fwd_bwd":
        _forward_backward(p, arg)
    elif name == "zero_grad":
        none = arg == "none"
        p.ref.opt.zero_grad(set_to_none=none)
        if not p.plant.keeps_grads_on_zero(p.par.layout, none):
            p.run.opt.zero_grad(set_to_none=none)
    elif name == "clip" and arg == "value":
        scaler.unscale(p)
        for twin in (p.ref, p.run):
            torch.nn.utils.clip_grad_value_([q for q in twin.model.parameters() if q.grad is not None], CLIP_VALUE)
    elif name == "clip":
        norm = math.inf if arg == "inf" else hooks.CLIP_MAX_NORM if arg in ("total_norm", "foreach") else float(arg)
        scaler.unscale(p)
        totals = []
        for twin in (p.ref, p.run):
            params = [q for q in twin.model.parameters() if q.grad is not None]  # as trainers clip
            total = (hooks.clip(params, arg) if arg in ("total_norm", "foreach")
                     else torch.nn.utils.clip_grad_norm_(params, norm, norm_type=2.0 if arg != "inf" else math.inf))
            totals.append(float(total.full_tensor() if hasattr(total, "full_tensor") else total))
        p.clip_totals = scaler.clip_totals(p, (totals[0], totals[1]))
    elif name in ("step", "sched"):
        for twin in (p.ref, p.run):
            if name == "step" and twin.scaling is not None:
                scaler.step(twin)
            else:
                (twin.opt if name == "step" else twin.sched).step()
            if arg == "ema":
                hooks.average(twin, sharded=twin is p.run and p.par.layout in FSDP,
                              stale=twin is p.run and p.plant.reads_stale_shard_in_ema(p.par.layout, p.par.rank))
        if arg == "precompute":
            float8.start_precomputing(p)
    elif name == "eval" and arg == "nogc":
        checkpointing.generate_unchecked(p, lambda: _eval(p, "generate"))
    elif name == "eval":
        _eval(p, arg)
    elif name == "metric":
        _metric(p, arg)
    elif name == "save":
        checkpoint.save(p, arg)
        scaler.save(p)
    elif name == "load" and arg not in ("", "model"):  # a restart: the model built again (program_relayout.py)
        relayout.load(p, arg, lambda: build(p.spec, p.par.layout, p.dist.device_type), fresh_scheduler)
        float8.hook_again(p)  # a restart of a precomputing float8 run registers its hook again
        scaler.load(p)  # a restarted loss-scaled run reads its scaler back (load=file: the only restart it draws)
        p.ref.ema = p.run.ema = None  # a restart drops the EMA copy (training_program.State.averaged)
    elif name == "load":
        checkpoint.load(p, fresh_scheduler, model_only=arg == "model")
        if arg != "model":
            scaler.load(p)
    elif name in ("freeze", "unfreeze"):
        _freeze(p, part_of(arg), name == "unfreeze")
        if arg != part_of(arg):
            _add_param_group(p, part_of(arg))
    elif name == "lr":
        for twin in (p.ref, p.run):
            for group in twin.opt.param_groups:
                group["lr"] *= float(arg)
    elif name == "new_optim":
        p.ref.new_optimizer()
        p.run.new_optimizer()
        float8.hook_again(p)
    elif name == "reset_state":
        p.ref.opt.state.clear()
        p.run.opt.state.clear()
    elif name == "reshard":
        p.divided = fsdp_method(p.run.model, arg, p.par.dp_size) or p.divided
    elif name == "compile" and arg == "blocks":
        compile_blocks(p.run.model, "aot_eager")
    elif name == "compile":  # the run only: the reference stays eager, what users expect compile to equal
        p.run.runnable = torch.compile(p.run.runnable, backend=arg)
    else:
        raise ValueError(f"the programs runner has no action {name!r}")


@dataclass
class Divergence:
    index: int
    action: str
    problems: list[str]


def run_program(spec: Any, dist: Any, plant: Plant, checkpoint_dir: str) -> Divergence | None:
    """Runs `spec` on every rank; the first action where the run leaves the reference, or None."""
    from distci.training_program import split

    p = start(spec, dist, plant, checkpoint_dir)
    structure = placements(p.run)
    try:
        for i, tok in enumerate(spec.actions):
            name, arg = split(tok)
            apply(p, name, arg)
            problems = compare(p)
            now = placements(p.run)
            if name == "load" and arg not in ("", "model"):  # laid out again: its placements are the new ones
                structure = now
            if now != structure:
                problems.append(f"placements changed: {sorted(set(now.items()) ^ set(structure.items()))}")
            problems = _every_ranks(problems)
            if problems:
                return Divergence(i, tok, problems)
        return None
    finally:
        checkpoint.wait(p, end=True)  # no save still writing into the next program's directory


def _every_ranks(problems: list[str]) -> list[str]:
    """Every rank's problems, the same list on every rank (collective): a problem one rank
    sees alone (a buffer of its own) must stop all ranks at the same action, or the others
    would walk into the next collective and hang."""
    import torch.distributed as tdist

    lists: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(lists, problems)
    out: list[str] = []
    for rank_problems in lists:
        out += [x for x in rank_problems if x not in out]
    return out
