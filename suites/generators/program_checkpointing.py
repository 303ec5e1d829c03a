"""Activation checkpointing as trainers switch it on, for the programs generator (round
`later_ac`: distci/program_forms.py's LATER_FORMS_AC says which trainer makes each form).

Vocabulary: a **kind** is how a layout checkpoints its blocks (distci/training_program.py's
CHECKPOINTED maps a layout to its kind):
  - `wrap`: every block in `checkpoint_wrapper` (non-reentrant), torchtitan's and torchtune's;
  - `selective`: the wrapper with torchtitan's op-level selective policy (matmul outputs saved);
  - `composable`: `torch.distributed._composable.checkpoint(block)`, in place;
  - `hf`: Hugging Face's `gradient_checkpointing_enable()`: the model's forward runs each block
    through `checkpoint(block.__call__, x, use_reentrant=True)` (programs.Net.checkpointing),
    from outside the block's own hooks, and the model's input made to require grad
    (`enable_input_require_grads()`, without which reentrant checkpoint of the first block sees
    no input that requires grad and returns no gradient).

Checkpointing recomputes, it never changes what a step computes: the reference checkpoints its
full model the same way, and the judge compares as it does without checkpointing.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn as nn

KINDS = ("wrap", "selective", "composable", "hf")


def missing(kind: str) -> str:
    """Why this torch cannot checkpoint as `kind` ("" it can): the entry skips with it."""
    try:
        if kind == "composable":
            from torch.distributed._composable import checkpoint  # noqa: F401
        elif kind == "selective":
            from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts  # noqa: F401
    except ImportError as e:
        return f"{kind} activation checkpointing is not in this torch: {e}"
    return ""


def apply(model: nn.Module, kind: str) -> None:
    """`kind` on `model`'s blocks (nothing for ""), where trainers do it: after TP, before
    FSDP2 or DDP (distci/training_program.py's CHECKPOINTED)."""
    if not kind:
        return
    if kind not in KINDS:
        raise ValueError(f"no checkpointing kind {kind!r}; kinds: {', '.join(KINDS)}")
    if kind == "hf":
        enable(model)
    elif kind == "composable":
        from torch.distributed._composable import checkpoint

        for block in model.blocks:
            checkpoint(block)
    else:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        extra = {"context_fn": selective_context()} if kind == "selective" else {}
        for i, block in enumerate(model.blocks):
            model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False, **extra)


def selective_context() -> Callable[[], Any]:
    """torchtitan's op-level selective AC (`_apply_op_sac`): matmul outputs saved, the rest
    recomputed (the generators' one policy: the models generator's ac=selective uses it too;
    the scenario rows keep torchtitan's own save list, suites/runner/parallelize.py)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


def enable(model: nn.Module, input_grads: bool = True) -> None:
    """transformers' `gradient_checkpointing_enable()` with its defaults (reentrant): the
    model's forward checkpoints each block from outside it, and `enable_input_require_grads()`
    (a hook that makes the model's input require grad; `input_grads=False` leaves it out, the
    ac_reenable plant)."""
    from torch.utils.checkpoint import checkpoint

    model.checkpointing = functools.partial(checkpoint, use_reentrant=True)
    if input_grads and getattr(model, "_require_grads_hook", None) is None:
        model._require_grads_hook = model.register_forward_pre_hook(_inputs_require_grad)


def disable(model: nn.Module) -> None:
    """transformers' `gradient_checkpointing_disable()` with `disable_input_require_grads()`
    (PEFT models take the hook off with it)."""
    model.checkpointing = None
    hook = getattr(model, "_require_grads_hook", None)
    if hook is not None:
        hook.remove()
        model._require_grads_hook = None


def _inputs_require_grad(module: nn.Module, args: tuple) -> tuple:
    return (args[0].detach().requires_grad_(True), *args[1:])


def generate_unchecked(p: Any, generate: Callable[[], None]) -> None:
    """eval=nogc on both twins: checkpointing switched off, `generate()` (the programs runner's
    eval=generate), and on again, as TRL generates between training steps. The run's
    `enable` drops the input hook under the ac_reenable plant."""
    for twin in (p.ref, p.run):
        disable(twin.model)
    generate()
    for twin in (p.ref, p.run):
        enable(twin.model, input_grads=not (twin is p.run and p.plant.reenables_without_input_grads()))
