"""Distributed checkpoints for the `resume` rows: save under one layout, load under another;
and the full state dict every row exports at its end, as users export a trained model.

torch.distributed.checkpoint (DCP) with the state_dict helpers torchtitan uses
(get/set_model_state_dict, get/set_optimizer_state_dict): the saved state is keyed by
clean parameter FQNs and resharded on load, so a checkpoint written by 2-D FSDP2 + TP
loads into plain TP of another degree, FSDP2 alone or an unsharded model on every rank.
The directory is made by rank 0 and shared through the process group (the ranks of a
run share a file system).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from typing import Any, Iterator

import torch.nn as nn


@contextlib.contextmanager
def shared_dir() -> Iterator[str]:
    """A fresh directory every rank sees, removed by rank 0 once every rank is done.

    A rank leaving with an exception does not wait for the others: they may be blocked in
    a collective it never joins (a load that raised on one rank only), and a barrier here
    would hold its exception until the test's deadline, when the harness records the stacks
    of a hang and never the error that caused it. Rank 0 still removes the directory."""
    import torch.distributed as dist

    box = [tempfile.mkdtemp(prefix="distci-dcp-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    try:
        yield box[0]
    except BaseException:
        if dist.get_rank() == 0:
            shutil.rmtree(box[0], ignore_errors=True)
        raise
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(box[0], ignore_errors=True)


def _state(model: nn.Module, opt: Any) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


def save(model: nn.Module, opt: Any, path: str, asynchronous: bool = False) -> None:
    """dcp.save, or dcp.async_save waited on (torchtitan's async mode: training goes on
    while the checkpoint is written; a resume must find it complete)."""
    import torch.distributed.checkpoint as dcp

    if not asynchronous:
        dcp.save(_state(model, opt), checkpoint_id=path)
        return
    future = dcp.async_save(_state(model, opt), checkpoint_id=path)
    (future.upload_completion if hasattr(future, "upload_completion") else future).result()


def save_trainer_state(path: str, sched: Any, scaler: Any) -> None:
    """The LR scheduler's and the GradScaler's state beside the DCP checkpoint, one file a
    rank (Hugging Face Trainer's scheduler.pt / scaler.pt, Lightning's checkpoint keys,
    torchtitan's lr_schedulers in its state): a resumed run goes on with the schedule's step
    and the loss scale where they were, as every trainer that resumes does."""
    import torch
    import torch.distributed as dist

    state = {"sched": sched.state_dict() if sched is not None else None,
             "scaler": scaler.state_dict() if scaler is not None else None}
    torch.save(state, f"{path}/trainer_state_rank{dist.get_rank()}.pt")


def load_trainer_state(path: str, sched: Any, scaler: Any) -> None:
    """What `save_trainer_state` wrote, read back into this rank's new scheduler and scaler."""
    import torch
    import torch.distributed as dist

    state = torch.load(f"{path}/trainer_state_rank{dist.get_rank()}.pt", weights_only=False)
    if sched is not None and state["sched"] is not None:
        sched.load_state_dict(state["sched"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])


def load(model: nn.Module, opt: Any, path: str) -> None:
    """Loads model and optimizer state saved under any layout into this one, in place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = _state(model, opt)
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])


def load_pretrained(model: nn.Module, pretrained: Any, device: Any, make_buffers: Any) -> None:
    """Fills a model parallelized on the meta device as fine-tuning loads a pretrained one
    (torchtune, torchtitan's HF import): `to_empty` on `device`, the non-persistent buffers
    the state dict does not carry made again (`make_buffers(model)`), then rank 0's full
    state dict (`pretrained()`, called there only) broadcast into every rank's shards by
    set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    make_buffers(model)
    full = pretrained().state_dict() if dist.get_rank() == 0 else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


EXPORTED_LAYOUTS = ("single", "tp", "tp_sp", "fsdp", "fsdp_tp", "hsdp")
"""Layouts whose whole model lives on every rank's mesh, so one full state dict holds every
parameter. Not pp (a stage holds its own blocks), ep / ep_fsdp (experts live on their
owners as plain tensors or on a submesh) or cp (the model is replicated: nothing to gather)."""


def full_state_dict(model: nn.Module, local_shards: bool = False) -> dict[str, Any]:
    """The model as users export it after training (torchtitan's and the Hugging Face
    converters' path): get_model_state_dict with full_state_dict=True and cpu_offload=True,
    which gathers every DTensor (FSDP2's and TP's shards, 2-D strided ones too) and hands
    the whole dict to rank 0 on CPU; other ranks get an empty dict. Collective: every rank
    calls it. `local_shards` is a mutation: each rank's local shards, as if they were whole."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if local_shards:
        return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().cpu()
                for k, v in model.state_dict().items()}
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
