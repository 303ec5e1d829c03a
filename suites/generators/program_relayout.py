"""The programs generator's restarts: `load=LAYOUT` and `load=file` (round `later_reshard`,
distci/program_forms.py's LATER_FORMS_RESHARD), a checkpoint loaded into the same model
built again, as a job restarted from its last checkpoint builds it.

  - `load=LAYOUT`: the model is built again and laid out as LAYOUT (another layout these ranks
    run: fsdp, tp, fsdp_tp, ddp, hsdp), its optimizer is made again with the run's param
    groups (their parameters by name, their hyperparameters), its scheduler again, and the
    last save is loaded into them as that save's kind loads (program_checkpoint.load_run):
    DCP reshards what was saved under one layout into the other, the optimizer's state
    included (flattened keys for `save=flat`, as torchtitan's OptimizersContainer), and a
    full state dict is broadcast from rank 0 into the new layout. Training goes on under
    LAYOUT: the run's Parallel (its data-parallel group, so its share of the batch) is the
    new layout's from here on.
  - `load=file`: the model built again under its own layout, the checkpoint through one file
    on rank 0: a DCP save written out by `dcp_to_torch_save` and loaded as full state dicts
    broadcast from rank 0 (Hugging Face's and torchtune's full loads into sharded models); a
    full save written by torch.save and made a DCP checkpoint by `torch_save_to_dcp` (the
    conversion torchtitan documents for `--checkpoint.initial_load_path`), loaded by dcp.load.

The reference resumes from its in-memory checkpoint, as for a plain `load`. A restart holds
no gradients: both twins drop theirs. A correct load shows the same parameters, optimizer state,
LR, buffers and next steps as the reference; `compare` judges them after the load as after
every action.
"""

from __future__ import annotations

import copy
import inspect
import os
from dataclasses import replace
from typing import Any, Callable

import torch
import torch.nn as nn

from ..runner.evidence import clean_name
from . import program_checkpoint as checkpoint
from .program_layout import layout_model

FILE = "single.pt"
"""The single file `load=file` writes into the checkpoint directory (rank 0)."""
FROM_FILE = "from-single"
"""The DCP checkpoint torch_save_to_dcp makes of a full save's file."""


def load(p: Any, target: str, build: Callable[[], nn.Module], fresh_scheduler: Callable[[Any], Any]) -> None:
    """`load=target` on both twins (`target` a layout or `file`); `build()` makes the model
    as the program's start made it, before any layout."""
    checkpoint.wait(p)
    checkpoint.load_reference(p)
    p.ref.opt.zero_grad(set_to_none=True)
    rebuild(p, p.par.layout if target == "file" else target, build, fresh_scheduler,
            p.par.checkpointing if target == "file" else "")  # a restart as configured: its checkpointing too
    if p.plant.skips_optimizer_on_relayout(target):
        _skip_optimizer(p)
        return
    if target == "file":
        load_file(p)
    else:
        checkpoint.load_run(p, fresh_scheduler)


def _skip_optimizer(p: Any) -> None:
    """The relayout_optim plant (program_plants.py): the model and the scheduler restored,
    the optimizer's state left as the freshly made optimizer has it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    kind, full, sched = p.run.checkpoint
    model = checkpoint.module(p)
    if kind == "full":
        set_model_state_dict(model, copy.deepcopy(full[0]), options=checkpoint.state_dict_options(kind, loading=True))
    else:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=p.checkpoint_dir)
        set_model_state_dict(model, state["model"])
    p.run.sched.load_state_dict(sched)


def rebuild(p: Any, layout: str, build: Callable[[], nn.Module], fresh_scheduler: Callable[[Any], Any],
            checkpointing: str = "") -> None:
    """A new run twin under `layout`: the model built and laid out, its parameters frozen as
    the run's are, its optimizer made with the run's param groups (the same parameters by name,
    the same hyperparameters) and its scheduler made again; the old twin's model is dropped."""
    old = p.run
    model = build()
    # Frozen BEFORE laying out, as a trainer restarting a partly frozen model does (torchtune sets
    # its trainable parameters before wrapping): DDP fixes its buckets at construction, so freezing
    # after the wrap was distci's own distci-ddp-freeze-after-wrap (found 2026-12-07 as
    # `fsdp_ac-...:freeze=head,...,load=ddp,fwd_bwd=nosync,fwd_bwd=twice`, gradient SQNR 0.5 dB).
    plain = {clean_name(n): q for n, q in model.named_parameters()}
    for name, q in old.named.items():
        plain[name].requires_grad_(q.requires_grad)
    runnable, par = layout_model(model, layout, p.dist, checkpointing)
    named = {clean_name(n): q for n, q in model.named_parameters()}
    for name, q in old.named.items():  # and on what the layout registered, should it make new ones
        named[name].requires_grad_(q.requires_grad)
    names = {id(q): n for n, q in old.named.items()}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [named[names[id(q)]] for q in g["params"]]}
              for g in old.opt.param_groups]
    cls = type(old.opt)
    accepted = inspect.signature(cls.__init__).parameters
    opt = cls(groups, **{k: v for k, v in old.opt.defaults.items() if k in accepted})
    p.run = replace(old, model=model, runnable=runnable, named=named, opt=opt)
    p.run.sched = fresh_scheduler(opt)
    p.par, p.divided, p.unsynced = par, False, False


def load_file(p: Any) -> None:
    """The run's side of `load=file` (module docstring), into the twin `rebuild` made."""
    import torch.distributed as tdist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict, set_model_state_dict,
                                                         set_optimizer_state_dict)

    kind, full, sched = p.run.checkpoint
    model, opt = checkpoint.module(p), p.run.opt
    path, rank0 = os.path.join(p.checkpoint_dir, FILE), tdist.get_rank() == 0
    flat = kind == "flat"
    if kind == "full":
        converted = os.path.join(p.checkpoint_dir, FROM_FILE)
        if rank0:
            torch.save({"model": full[0], "optim": full[1]}, path)
            torch_save_to_dcp(path, converted)
        tdist.barrier()
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        dcp.load(state, checkpoint_id=converted)
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])
    else:
        if rank0:
            dcp_to_torch_save(p.checkpoint_dir, path)
        tdist.barrier()
        state = torch.load(path, weights_only=False) if rank0 else {"model": {}, "optim": {}}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, flatten_optimizer_state_dict=flat)
        set_model_state_dict(model, state["model"], options=options)
        set_optimizer_state_dict(model, opt, state["optim"], options=options)
    p.run.sched.load_state_dict(sched)
