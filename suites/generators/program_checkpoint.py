"""The programs generator's checkpoint actions (`save=KIND`, `load`), on both twins.

The reference saves and loads its plain `state_dict()`s (model, optimizer, scheduler) in memory;
the run goes through torch.distributed.checkpoint as trainers do:
  - `dcp`: dcp.save / dcp.load of get_model_state_dict + get_optimizer_state_dict, then
    set_model_state_dict + set_optimizer_state_dict (torchtitan `components/checkpoint.py`);
  - `flat`: the same with StateDictOptions(flatten_optimizer_state_dict=True) on the optimizer's
    get and set, as torchtitan's OptimizersContainer (`components/optimizer.py`) saves and loads;
  - `full`: full_state_dict=True, cpu_offload=True gathered, then loaded with
    broadcast_from_rank0=True (torchtune's and Lightning's full state dicts);
  - `async`: dcp.async_save of the `dcp` state dicts; training goes on while it writes, and the
    next save or load first waits for it (torchtitan's `async_mode="async"`: the checkpointer
    waits for the last save's future before it saves again, and before it loads).
`load=model` loads the model alone, and not its head: StateDictOptions(strict=False) with the
head's keys left out (fine-tuning from a pretrained backbone with a new head, torchtune's and
Hugging Face's `load_state_dict(strict=False)`, torchtitan's model-only initial load); the
optimizer and scheduler keep their state.
The scheduler's state_dict is kept in memory on both sides (trainers save it beside the model).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch


def state_dict_options(kind: str, loading: bool) -> Any:
    """The StateDictOptions a save of `kind` gets and loads with."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if kind == "flat":
        return StateDictOptions(flatten_optimizer_state_dict=True)
    # dcp and async: the defaults
    if kind == "full":
        return StateDictOptions(full_state_dict=True, broadcast_from_rank0=True) if loading else \
            StateDictOptions(full_state_dict=True, cpu_offload=True)
    return StateDictOptions()


def module(p: Any) -> torch.nn.Module:
    """What the state-dict functions take: DDP's wrapper, else the parallelized model."""
    return p.run.runnable if p.par.layout == "ddp" else p.run.model


def wait(p: Any, end: bool = False) -> None:
    """Waits for the last async save, if one is still writing (before a save, a load, and at
    the program's end, which also ends the save's own process group)."""
    import torch.distributed as tdist

    if p.pending_save is not None:
        p.pending_save.result()
        p.pending_save = None
    if end and p.async_group is not None:
        tdist.destroy_process_group(p.async_group)
        p.async_group = None


def _async_group(p: Any) -> Any:
    """The gloo group an async save synchronizes on: its own, as torchtitan's checkpointer
    makes one (`dist.new_group(backend="gloo")`): the save's thread issues collectives while
    training issues others, and two threads driving one group is undefined (on a gloo-only job
    the default group aborts the process: gloo::EnforceNotMet)."""
    import torch.distributed as tdist

    if p.async_group is None:
        p.async_group = tdist.new_group(backend="gloo")
    return p.async_group


def save(p: Any, kind: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    wait(p)
    p.ref.checkpoint = copy.deepcopy((p.ref.model.state_dict(), p.ref.opt.state_dict(), p.ref.sched.state_dict()))
    model, opt, options = module(p), p.run.opt, state_dict_options(kind, loading=False)
    sched = copy.deepcopy(p.run.sched.state_dict())
    if kind == "full":
        # a copy, as torch.save to a file is: on CPU, cpu_offload returns the optimizer's own
        # tensors for what no collective gathered (plain parameters' state, every `step`), and
        # the steps after the save would move the "saved" state with them
        full = copy.deepcopy((get_model_state_dict(model, options=options),
                              get_optimizer_state_dict(model, opt, options=options)))
        p.run.checkpoint = (kind, full, sched)
        return
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt, options=options)}
    if kind == "async":
        p.pending_save = p.plant.async_save(dcp)(state, checkpoint_id=p.checkpoint_dir, process_group=_async_group(p))
    else:
        dcp.save(state, checkpoint_id=p.checkpoint_dir)
    p.run.checkpoint = (kind, None, sched)


HEAD = "head."
"""What `load=model` leaves out: the part a fine-tune replaces."""


def _without_head(state: dict, plant: Any = None) -> dict:
    if plant is not None and plant.loads_what_was_left_out():
        return state
    return {k: v for k, v in state.items() if not k.startswith(HEAD)}


def load_model(p: Any) -> None:
    """`load=model`: both twins' models, head left out, from their last save (module docstring)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    wait(p)
    p.ref.model.load_state_dict(_without_head(p.ref.checkpoint[0]), strict=False)
    model = module(p)
    kind, full, _ = p.run.checkpoint
    if kind == "full":
        state = _without_head(copy.deepcopy(full[0]), p.plant)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    else:
        state = {"model": _without_head(get_model_state_dict(model), p.plant)}
        dcp.load(state, checkpoint_id=p.checkpoint_dir)
        state, options = state["model"], StateDictOptions(strict=False)
    set_model_state_dict(model, state, options=options)


def _shift_factored(optim: dict, model: dict) -> None:
    """The factored_rows plant (program_plants.py): each optimizer state tensor shaped unlike its
    parameter, with more than one row, rolled by half its rows."""
    for fqn, state in optim.get("state", {}).items():
        shape = tuple(model[fqn].shape) if fqn in model else None
        for key, value in state.items():
            if torch.is_tensor(value) and value.ndim and value.shape[0] > 1 and tuple(value.shape) != shape:
                state[key] = torch.roll(value, value.shape[0] // 2, dims=0)


def load_reference(p: Any) -> None:
    """The reference resumes from its in-memory checkpoint (every `load` but `load=model`)."""
    ref_model, ref_opt, ref_sched = p.ref.checkpoint
    p.ref.model.load_state_dict(ref_model)
    p.ref.opt.load_state_dict(ref_opt)
    p.ref.sched.load_state_dict(ref_sched)


def load(p: Any, fresh_scheduler: Callable[[Any], Any], model_only: bool = False) -> None:
    """Resume both twins from their last save; `fresh_scheduler(optimizer)` makes the
    scheduler a plant that drops the scheduler's state gets instead."""
    if model_only:
        load_model(p)
        return
    wait(p)
    load_reference(p)
    load_run(p, fresh_scheduler)


def load_run(p: Any, fresh_scheduler: Callable[[Any], Any]) -> None:
    """The run's side of a resume, into whatever model and optimizer `p.run` holds now (its
    own, or those program_relayout.py built under another layout)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    model, opt = module(p), p.run.opt
    kind, full, sched = p.run.checkpoint
    options = state_dict_options(kind, loading=True)
    kept = {n: b.clone() for n, b in p.run.model.named_buffers()} \
        if p.plant.keeps_buffers_on_load(p.par.rank) else {}
    if kind == "full":
        # a fresh copy per load, as torch.load of the file gives: set_model_state_dict replaces
        # the values of the dict it is given by the model's DTensors (known issue
        # dsd-set-model-state-dict-mutates-input), so a second load of the same dict is not a resume
        full = copy.deepcopy(full)
        set_model_state_dict(model, full[0], options=options)
        if p.plant.shifts_factored_state(kind):
            _shift_factored(full[1], full[0])
        if not p.plant.skips_optimizer_load(p.par.layout, kind):
            set_optimizer_state_dict(model, opt, full[1], options=options)
    else:
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt, options=options)}
        dcp.load(state, checkpoint_id=p.checkpoint_dir)
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"], options=options)
    with torch.no_grad():
        for name, b in p.run.model.named_buffers():
            if name in kept:
                b.copy_(kept[name])
    if p.plant.drops_scheduler_on_load():
        p.run.sched = fresh_scheduler(opt)
    else:
        p.run.sched.load_state_dict(sched)
