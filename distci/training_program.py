"""A training program, the programs generator's case: its text, its parser, and the inventory
of the calls real training loops make, as data, with where each comes from. A record both
sides read: the engine (distci/fuzz/programs.py) draws and shrinks programs, the cell side
(suites/generators/programs_entry.py) parses a program back from its test id and runs it.

Vocabulary. An **action** is one call (or one short idiom) a training loop makes on its
model, parameters, gradients, optimizer, LR scheduler, state dicts or process groups;
`name=arg` picks one of its forms, the first arg the plainest. A **program** is a
sequence of actions on one model under one **layout** (how it is parallelized) on
`world_size` ranks. The **state** is what the preconditions read: an action is drawn
only where the loops it comes from make it (no clip before a backward, no load before a
save, no optimizer step in the middle of a no-sync accumulation).

Each row says what the action does and which trainers make it (paths in their upstream
repositories, read 2026-12-06): torchtitan `torchtitan/train.py` (train_step: zero_grad,
microbatch forward/backward, clip_grad_norm_, optimizers.step, lr_schedulers.step;
validator; checkpointer.save per step) and `torchtitan/components/checkpoint.py` (DCP
save/load of get/set_model_state_dict and get/set_optimizer_state_dict); torchtune
`recipes/full_finetune_distributed.py` (zero_grad(set_to_none=True) after step, clip,
validate(): eval + no_grad + all_reduce of the metric + train()) and
`recipes/lora_finetune_distributed.py` (frozen base, trainable adapters, full state
dicts gathered to rank 0 on CPU, `torchtune/training/_distributed.py`
load_from_full_model_state_dict broadcasting rank 0's); Hugging Face accelerate
`src/accelerate/accelerator.py` (accumulate(): no_sync / FSDP2
set_requires_gradient_sync, clip_grad_norm_, save_state/load_state); Lightning
`src/lightning/fabric/strategies/model_parallel.py` (ModelParallelStrategy: fully_shard,
StateDictOptions(full_state_dict, cpu_offload) save and load).

A **form** is a variant of a drawn value that real trainers also write: torchtitan's
`components/checkpoint.py` and `components/optimizer.py` save and load the optimizer with
StateDictOptions(flatten_optimizer_state_dict=True) (`save=flat`); its default training config
runs FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), as
torchtune's recipes do (`fsdp_mp`); plain SGD without momentum is stateless (`sgd0`, the
examples' and many fine-tuning scripts' optimizer). FORMS (distci/program_forms.py, with the
later rounds' tables) maps a drawn value to its forms;
`draw` (distci/fuzz/programs.py) picks among them with a stream of its own, so adding a form
never moves a seed's main draw (layout, sizes, actions: plants' seeds, replayed nights); only
the value that gains the form may now take it, and the forms picked after it may change.
`adamw_groups` (two param groups, weight decay on matrices only) is a form of `adamw`.

Pure data and pure functions: no torch (the engine draws and shrinks on the controller).

A program's text is its test id, e.g. `fsdp-ws2-w8-l2-adamw:fwd_bwd,step,save=dcp,fwd_bwd,step,load`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Callable

from distci.program_forms import RELAYOUTS, is_form

LAYOUTS: dict[str, tuple[int, ...]] = {"fsdp": (2, 4), "tp": (2, 4), "fsdp_tp": (4,), "ddp": (2, 4),
                                       "fsdp_mp": (2, 4), "fsdp_offload": (2, 4), "hsdp": (4,), "fsdp_f8": (2, 4),
                                       "tp_f8": (2, 4), "fsdp_amp": (2, 4), "hsdp_amp": (4,), "tp_amp": (2, 4),
                                       "fsdp_tp_amp": (4,), "ddp_amp": (2, 4), "fsdp_ac": (2, 4), "fsdp_sac": (2, 4),
                                       "fsdp_cac": (2, 4), "fsdp_hfac": (2, 4), "ddp_ac": (2, 4), "ddp_hfac": (2, 4),
                                       "tp_ac": (2, 4), "fsdp_tp_ac": (4,)}
"""Layout -> the world sizes it runs on (fsdp_tp: a 2x2 mesh, dp outer, tp inner; fsdp_mp: FSDP2
computing in bfloat16, reducing in float32; fsdp_offload: FSDP2 with CPUOffloadPolicy; hsdp:
FSDP2 on a (dp_replicate, dp_shard) 2x2 mesh, sharded within a replica, replicated across; fsdp_f8:
torchao float8 training, tensorwise, its weights all-gathered in float8, then FSDP2; tp_f8: float8
training, then TP with torchao's Float8ColwiseParallel / Float8RowwiseParallel; LAYOUT_amp: LAYOUT
trained through torch.amp.GradScaler, LATER_FORMS_AMP; CHECKPOINTED: LAYOUT with its blocks'
activations checkpointed, LATER_FORMS_AC)."""
AMP = {"fsdp_amp": "fsdp", "hsdp_amp": "hsdp", "tp_amp": "tp", "fsdp_tp_amp": "fsdp_tp", "ddp_amp": "ddp"}
"""Layouts that train through a loss scaler -> the layout they lay the model out as."""
CHECKPOINTED = {"fsdp_ac": ("fsdp", "wrap"), "fsdp_sac": ("fsdp", "selective"), "fsdp_cac": ("fsdp", "composable"),
                "fsdp_hfac": ("fsdp", "hf"), "ddp_ac": ("ddp", "wrap"), "ddp_hfac": ("ddp", "hf"), "tp_ac": ("tp", "wrap"),
                "fsdp_tp_ac": ("fsdp_tp", "wrap")}
"""Layouts whose blocks checkpoint their activations -> (the layout they lay the model out as,
how: suites/generators/program_checkpointing.py's KINDS)."""
DATA_PARALLEL = ("fsdp", "fsdp_tp", "ddp", "fsdp_mp", "fsdp_offload", "hsdp", "fsdp_f8", "fsdp_amp", "hsdp_amp",
                 "fsdp_tp_amp", "ddp_amp", "fsdp_ac", "fsdp_sac", "fsdp_cac", "fsdp_hfac", "ddp_ac", "ddp_hfac",
                 "fsdp_tp_ac")
"""Layouts whose ranks see different rows and reduce gradients (no-sync accumulation exists)."""
FSDP = ("fsdp", "fsdp_tp", "fsdp_mp", "fsdp_offload", "hsdp", "fsdp_f8", "fsdp_amp", "hsdp_amp", "fsdp_tp_amp",
        "fsdp_ac", "fsdp_sac", "fsdp_cac", "fsdp_hfac", "fsdp_tp_ac")
FLOAT8 = ("fsdp_f8", "tp_f8")
"""Layouts whose model is converted to torchao float8 training before it is parallelized."""
IN_BACKWARD = ("fsdp", "tp", "fsdp_tp", "hsdp", "fsdp_mp", "fsdp_offload", "fsdp_ac", "fsdp_sac", "fsdp_cac",
               "fsdp_hfac", "tp_ac", "fsdp_tp_ac")
"""Layouts where a post-accumulate-grad hook sees the gradient the step needs (fwd_bwd=inbwd):
FSDP2 calls it after the reduce-scatter, TP's DTensor gradients are whole; DDP's hook sees the
local gradient before the bucket's all-reduce (meaningless to step on), a loss scaler must
unscale every gradient before any step, and float8's precompute runs after a whole step.
Checkpointed blocks step in backward too (torchtune's optimizer_in_bwd with activation checkpointing)."""
PRECOMPUTE = ("fsdp_f8",)
"""Layouts whose float8 weights FSDP2 all-gathers in float8: where precompute has scales to make."""
OPTIMIZERS = ("sgd", "adamw", "sgd0", "adamw_groups", "adamw_fused", "adamw_foreach", "adam", "nadam", "radam",
              "adafactor", "muon", "adagrad", "rmsprop")
"""sgd: momentum 0.9; sgd0: no momentum (no optimizer state at all); adamw_groups: AdamW with two
param groups, weight decay on matrices only (nanoGPT's configure_optimizers, Hugging Face
Trainer's get_decay_parameter_names, torchtune's and Lightning's examples); the rest are the
`later_optim` round's forms (LATER_FORMS_OPTIM), never drawn by the main stream."""
WIDTHS = (8, 16, 32)
LAYERS = (1, 2, 3)
PARTS = ("block0", "head")
"""Submodules a program freezes and unfreezes (block0: the first block; head: the output)."""


@dataclass(frozen=True)
class State:
    """What the preconditions read: the abstract state of the model and its optimizer."""

    grads: bool = False
    """Some parameter holds a gradient (None after zero_grad(set_to_none=True))."""
    unsynced: bool = False
    """A no-sync backward ran since the last synchronized one: local gradients are partial."""
    saved: str = ""
    """The kind of the last checkpoint saved ("" none yet)."""
    frozen: frozenset = frozenset()
    excluded: frozenset = frozenset()
    """Frozen parts the optimizer was made without (new_optim while they were frozen): only
    those can be added back as a param group (`unfreeze=PART_group`)."""
    added: int = 0
    """Param groups added since the optimizer was made."""
    saved_added: int = 0
    """`added` at the last save: a load needs the same groups (optimizer.load_state_dict refuses others)."""
    compiled: bool = False
    backwards: int = 0
    layout: str = ""
    """The layout the program runs under now: its own, until a `load=LAYOUT`."""
    world_size: int = 0
    averaged: bool = False
    """An EMA copy of the weights exists (step=ema made it; a restart drops it): eval=ema reads it."""
    unscaled: bool = False
    """A clip ran since the last step: under a loss scaler it unscale_d the gradients, and a
    backward before the step would add scaled ones the step never unscales (GradScaler's
    contract: unscale_ once, after the step's last backward). Read on LAYOUT_amp only."""


@dataclass(frozen=True)
class Action:
    """One row of the inventory."""

    name: str
    args: tuple[str, ...]
    does: str
    sources: str
    weight: float
    enabled: Callable[[State, str, str], bool]
    """(state, layout, arg) -> may a loop make this call here?"""
    effect: Callable[[State, str], State]


def _synced(s: State, layout: str, arg: str) -> bool:
    return not s.unsynced


def _fwd_bwd_ok(s: State, layout: str, arg: str) -> bool:
    return ((arg != "nosync" or layout in DATA_PARALLEL) and (arg != "noreduce" or AMP.get(layout, layout) == "hsdp")
            and (arg not in ("spike", "badlabel") or layout in AMP) and not (layout in AMP and s.unscaled)
            and (arg != "inbwd" or (layout in IN_BACKWARD and not s.grads))
            and len(s.frozen) < len(PARTS))


def _fwd_bwd(s: State, arg: str) -> State:
    return replace(s, grads=arg != "inbwd", unsynced=arg in ("nosync", "noreduce"), backwards=s.backwards + 1)


def _step_ok(s: State, layout: str, arg: str) -> bool:
    """Not inside an accumulation; precompute on float8 layouts only; under a loss scaler only
    with a gradient to unscale (GradScaler.step asserts that unscale_ recorded an inf check, and
    an fp16 loop steps after its backward)."""
    return not s.unsynced and (arg != "precompute" or layout in PRECOMPUTE) and (layout not in AMP or s.grads)


def _eval_ok(s: State, layout: str, arg: str) -> bool:
    """`nogc` switches Hugging Face's gradient checkpointing off and on: where it is on; `ema`
    evaluates the EMA copy: once a step made one."""
    return (not s.unsynced and (arg != "nogc" or CHECKPOINTED.get(layout, ("", ""))[1] == "hf")
            and (arg != "ema" or s.averaged))


def _freeze_ok(s: State, layout: str, arg: str) -> bool:
    return not s.unsynced and arg not in s.frozen and len(s.frozen) + 1 < len(PARTS)


def part_of(arg: str) -> str:
    """The submodule an unfreeze names (`head_group` -> `head`)."""
    return arg.removesuffix("_group")


def _unfreeze_ok(s: State, layout: str, arg: str) -> bool:
    """A frozen part; added as a group only if the optimizer lacks it."""
    part = part_of(arg)
    if s.unsynced or part not in s.frozen:
        return False
    return arg == part or part in s.excluded


def _unfreeze(s: State, arg: str) -> State:
    part = part_of(arg)
    if arg == part:
        return replace(s, frozen=s.frozen - {part})
    return replace(s, frozen=s.frozen - {part}, excluded=s.excluded - {part}, added=s.added + 1)


def _load_ok(s: State, layout: str, arg: str) -> bool:
    """After a save, outside accumulation, with the saved groups; `load=LAYOUT` under another
    layout these ranks run, from a layout whose model is the plain one (a float8 layout's
    linears are converted: laid out plainly it is another model than the one saved) and that
    trains without a loss scaler (LAYOUT_amp restarts through `load=file` only: a restart under a
    plain layout would drop the scaler its checkpoint carries)."""
    if not s.saved or s.unsynced or s.saved_added != s.added:
        return False
    return arg not in LAYOUTS or (arg != layout and layout not in FLOAT8 and layout not in AMP
                                  and s.world_size in LAYOUTS[arg])


def _load(s: State, arg: str) -> State:
    if arg in LAYOUTS:
        return replace(s, layout=arg, grads=False, averaged=False)
    return replace(s, grads=False, averaged=False) if arg == "file" else s


def _clip_ok(s: State, layout: str, arg: str) -> bool:
    """Gradients exist and are synchronized. Not `foreach` (error_if_nonfinite=True) under a loss
    scaler: its overflowing steps are expected and skipped, so a trainer that raises on a
    non-finite norm cannot train with one, and the single-process reference raises alike at the
    first overflow (`fsdp_amp-ws2-w8-l1-sgd:fwd_bwd=badlabel,clip=foreach`, 2026-12-07: nothing
    distributed left to compare)."""
    return s.grads and not s.unsynced and not (arg == "foreach" and layout in AMP)


INVENTORY: tuple[Action, ...] = (
    Action("fwd_bwd", ("sync", "nosync", "twice", "noreduce", "spike", "badlabel", "inbwd"),
           "forward of the next batch, loss, backward; `nosync`: without the gradient reduction "
           "(FSDP2 set_requires_gradient_sync(False), DDP no_sync()), as accumulation's early microbatches; "
           "`twice`: two forwards (the batch's halves), one backward of their mean loss; `noreduce` (hsdp): "
           "reduce-scattered, not all-reduced across replicas (set_requires_all_reduce(False)); `spike` "
           "(LAYOUT_amp): data-parallel rank 0's loss spiked until its scaled gradients overflow; `badlabel` "
           "(LAYOUT_amp): rank 0's first target an inf; `inbwd`: the optimizer stepped in backward, each "
           "gradient by its post-accumulate-grad hook, then dropped",
           "torchtitan train.py forward_backward_step; accelerate accumulate(); torchtune recipes; "
           "twice: GAN discriminators, two-view contrastive losses, DPO's separate chosen/rejected forwards; "
           "spike: an outlier batch of an fp16 run (accelerate / Lightning skip the step)", 6.0,
           _fwd_bwd_ok, _fwd_bwd),
    Action("zero_grad", ("none", "zeros"),
           "optimizer.zero_grad(set_to_none=True) / (set_to_none=False): gradients dropped or zeroed in place",
           "torchtitan train_step start; torchtune after step (set_to_none=True); Lightning/accelerate default",
           2.0, _synced, lambda s, a: replace(s, grads=a == "zeros" and s.grads)),
    Action("clip", ("1.0", "0.05", "inf", "value", "total_norm", "foreach"),
           "torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type) over DTensor gradients; "
           "`value`: clip_grad_value_(params, 0.01); `total_norm`: get_total_norm, then "
           "clip_grads_with_norm_; `foreach`: clip_grad_norm_(foreach=True, error_if_nonfinite=True)",
           "torchtitan dist_utils.clip_grad_norm_; torchtune recipes; accelerate clip_grad_norm_; "
           "value: Lightning gradient_clip_algorithm='value', accelerate clip_grad_value_", 1.5,
           _clip_ok, lambda s, a: replace(s, unscaled=True)),
    Action("step", ("", "precompute", "ema"), "optimizer.step(); `precompute` (fsdp_f8): and torchao's "
           "precompute_float8_dynamic_scale_for_fsdp after it, now and after every later step (a step post-hook); "
           "`ema`: and AveragedModel.update_parameters(model) after it (an EMA of the weights)",
           "every trainer; precompute: torchtitan float8 post_optimizer_hook; ema: Lightning "
           "EMAWeightAveraging, timm ModelEmaV3", 3.0, _step_ok,
           lambda s, a: replace(s, unscaled=False, averaged=s.averaged or a == "ema")),
    Action("sched", ("",), "lr_scheduler.step() (linear warmup then decay, a LambdaLR)",
           "torchtitan lr_schedulers.step; torchtune after step", 1.5, _synced, lambda s, a: s),
    Action("eval", ("no_grad", "inference_mode", "generate", "ema", "nogc"),
           "model.eval(); forward of the eval batch under torch.no_grad() / torch.inference_mode(); model.train(); "
           "`generate`: a generate-style method under no_grad (register_fsdp_forward_method); `ema`: through the "
           "EMA copy; `nogc` (LAYOUT_hfac): gradient_checkpointing_disable(), generate, gradient_checkpointing_enable()",
           "torchtune validate(); torchtitan validator; Lightning validation loop (EMA weights swapped in); "
           "nogc: TRL's generation between training steps", 1.0, _eval_ok, lambda s, a: s),
    Action("metric", ("all_reduce", "barrier"),
           "the step's loss all-reduced (avg) over the data-parallel ranks for logging / a barrier",
           "torchtitan dist_mean of the loss; torchtune all_reduce of running_loss", 0.7, _synced, lambda s, a: s),
    Action("save", ("dcp", "full", "flat", "async"),
           "checkpoint: dcp.save of get_model_state_dict + get_optimizer_state_dict + scheduler state "
           "(sharded) / full_state_dict=True, cpu_offload=True gathered to rank 0 (full) / dcp with "
           "flatten_optimizer_state_dict=True on save and load (flat) / dcp.async_save, awaited at the "
           "next save or load (async)",
           "torchtitan checkpoint.py (dcp, async_mode=async) and optimizer.py (flat); torchtune / "
           "Lightning full state dicts", 1.5,
           _synced,
           lambda s, a: replace(s, saved=a, saved_added=s.added)),
    Action("load", ("", "model") + RELAYOUTS + ("file",),
           "resume from the last save: dcp.load + set_model_state_dict + set_optimizer_state_dict + scheduler "
           "load_state_dict (dcp) / rank 0's full dicts with broadcast_from_rank0=True (full); `model`: the "
           "model alone, head left out, StateDictOptions(strict=False); `LAYOUT`: into the model and optimizer "
           "built again under another layout, training going on under it; `file`: through one file on rank 0 "
           "(dcp_to_torch_save / torch_save_to_dcp) into the model built again",
           "torchtitan checkpointer.load (a restart with another parallelism; initial_load_path); torchtune "
           "load_from_full_model_state_dict; Lightning load_checkpoint; HF full state dicts into sharded models",
           2.0, _load_ok, _load),
    Action("freeze", PARTS, "requires_grad_(False) on a submodule mid-run (its gradients set to None)",
           "torchtune LoRA set_trainable_params; staged fine-tuning (unfreeze schedules)", 0.5,
           _freeze_ok, lambda s, a: replace(s, frozen=s.frozen | {a})),
    Action("unfreeze", PARTS + tuple(f"{p}_group" for p in PARTS),
           "requires_grad_(True) on a frozen submodule; `PART_group`: and its parameters added to the "
           "optimizer as a new param group at a tenth of the lr (after a new_optim that left it out)",
           "staged fine-tuning (gradual unfreezing); Lightning BaseFinetuning.unfreeze_and_add_param_group", 0.5,
           _unfreeze_ok, _unfreeze),
    Action("lr", ("0.5", "2.0"), "every param group's lr multiplied (a manual LR change)",
           "LR range tests, warm restarts; accelerate/Lightning param_groups edits", 0.5, _synced,
           lambda s, a: s),
    Action("new_optim", ("",), "the optimizer and its scheduler made again over the parameters that require grad",
           "torchtune LoRA recipes after set_trainable_params; staged fine-tuning", 0.4, _synced,
           lambda s, a: replace(s, excluded=s.frozen, added=0)),
    Action("reset_state", ("",), "optimizer.state cleared (moments and step counts reset)",
           "warm restarts; RL trainers resetting Adam state", 0.3, _synced, lambda s, a: s),
    Action("reshard", ("false", "true", "forward_false", "unshard", "prefetch", "divide"),
           "an FSDP2 method on every FSDP module: set_reshard_after_backward(False/True); "
           "set_reshard_after_forward(False); unshard() then reshard(); explicit forward/backward prefetch "
           "block to block; set_gradient_divide_factor(1.0) with the loop dividing its loss",
           "torchtitan/torchtune gradient accumulation (keep unsharded params between microbatches); "
           "torchtitan fsdp.py (prefetch with EP, disable_fsdp_gradient_division), loss.py (unshard); "
           "torchtune recursive_reshard", 0.4,
           lambda s, l, a: l in FSDP and not s.unsynced, lambda s, a: s),
    Action("compile", ("aot_eager", "blocks"), "torch.compile of the module mid-run (later forwards run "
           "compiled); `blocks`: each block compiled in place (aot_eager)",
           "torchtitan apply_compile (per block); accelerate dynamo_backend", 0.15,
           lambda s, l, a: not s.compiled and not s.unsynced, lambda s, a: replace(s, compiled=True)),
)
BY_NAME = {a.name: a for a in INVENTORY}


def action(name: str) -> Action:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"no action {name!r}; actions: {', '.join(BY_NAME)}") from None


ENTRY_TEST = "suites/generators/programs_entry.py"
TEST_NAME = "test_program"
PROGRAMS_ENV = "DISTCI_FUZZ_PROGRAMS"
"""A JSON file: the list of program texts one batch runs (the entry reads it)."""
PROGRAM_ENV = "DISTCI_FUZZ_PROGRAM"
"""One program's text, for a repro."""
HEAD = re.compile(r"^(?P<layout>[a-z][a-z0-9_]*)-ws(?P<ws>\d+)-w(?P<width>\d+)-l(?P<layers>\d+)-(?P<optim>[a-z0-9_]+)$")


class ProgramError(ValueError):
    """A program text that does not parse or breaks a precondition; the message names the part."""


@dataclass(frozen=True)
class Program:
    layout: str
    world_size: int
    width: int
    layers: int
    optim: str
    actions: tuple[str, ...]
    """Each `name` or `name=arg` (INVENTORY above)."""

    @property
    def text(self) -> str:
        return (f"{self.layout}-ws{self.world_size}-w{self.width}-l{self.layers}-{self.optim}:"
                + ",".join(self.actions))

    def __str__(self) -> str:
        return self.text


def drawn_args(a: Action) -> tuple[str, ...]:
    """The args the main draw picks among (forms come from their own stream)."""
    return _drawn_args(a.name, a.args)


@functools.cache
def _drawn_args(name: str, args: tuple[str, ...]) -> tuple[str, ...]:
    """Cached: the draw asks it for every action at every step it draws (6 million calls in the
    quick tier's draws, 2026-12-07), and the answer depends on the constant form tables only."""
    return tuple(x for x in args if not is_form(name, x))


def split(token: str) -> tuple[str, str]:
    """`name=arg` -> (name, arg); `name` -> (name, its first arg)."""
    name, _, arg = token.partition("=")
    return name, arg or action(name).args[0]


def token(name: str, arg: str) -> str:
    return name if arg == action(name).args[0] else f"{name}={arg}"


def parse(text: str) -> Program:
    """A program from its text; raises ProgramError naming the bad part."""
    head, sep, body = text.strip().partition(":")
    m = HEAD.match(head)
    if not sep or not m:
        raise ProgramError(f"program {text!r}: write LAYOUT-wsN-wN-lN-OPTIM:ACTION,ACTION=ARG,... "
                           f"(layouts {', '.join(LAYOUTS)}; optimizers {', '.join(OPTIMIZERS)})")
    program = Program(m["layout"], int(m["ws"]), int(m["width"]), int(m["layers"]), m["optim"],
                      tuple(t.strip() for t in body.split(",") if t.strip()))
    problems = check(program)
    if problems:
        raise ProgramError(f"program {text!r}: {'; '.join(problems)}")
    return program


def check(program: Program) -> list[str]:
    """Why `program` is not one a training loop makes (empty: it is)."""
    out = []
    if program.layout not in LAYOUTS:
        return [f"no layout {program.layout!r}; layouts: {', '.join(LAYOUTS)}"]
    if program.world_size not in LAYOUTS[program.layout]:
        out.append(f"{program.layout} runs on world sizes {LAYOUTS[program.layout]}, not {program.world_size}")
    if program.optim not in OPTIMIZERS:
        out.append(f"no optimizer {program.optim!r}; optimizers: {', '.join(OPTIMIZERS)}")
    if program.width not in WIDTHS or program.layers not in LAYERS:
        out.append(f"width {program.width} / layers {program.layers}: widths {WIDTHS}, layers {LAYERS}")
    state = State(layout=program.layout, world_size=program.world_size)
    for i, tok in enumerate(program.actions):
        name, arg = tok.partition("=")[0], tok.partition("=")[2]
        if name not in BY_NAME:
            out.append(f"action {i} {tok!r}: no action {name!r}; actions: {', '.join(BY_NAME)}")
            break
        a = BY_NAME[name]
        arg = arg or a.args[0]
        if arg not in a.args:
            out.append(f"action {i} {tok!r}: {name} takes {', '.join(a.args)}")
            break
        if not a.enabled(state, state.layout, arg):
            out.append(f"action {i} {tok!r}: not where a loop makes it (state {state})")
            break
        state = a.effect(state, arg)
    if not out and state.unsynced:
        out.append("ends inside a no-sync accumulation (its gradients are never reduced)")
    return out


def valid(program: Program) -> bool:
    return not check(program)
