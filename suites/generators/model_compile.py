"""torch.compile in the models generator's parallel run, as trainers compile (the `compile`
and `backend` features of model_space.py).

  - blocks: torchtitan's apply_compile, each block `torch.compile(block, fullgraph=True)`
    after the TP plan and activation checkpointing, before FSDP2 (its units then wrap the
    compiled blocks), and torchtune's per-layer compile; under DDP / replicate the blocks
    are compiled before the wrapper. A block with the per-expert loop (experts > 0) is
    compiled with fullgraph=False: its `torch.where` has a data-dependent size and its
    `continue` a data-dependent branch, which no single graph holds (a trainer compiling
    such a block must allow the break; torchtitan's MoE compiles grouped GEMMs instead).
  - model: HF Trainer / accelerate's `dynamo_backend`, the whole model the step calls
    compiled after the layout is applied (`torch.compile(DDP(model))`, so DDP's buckets go
    through Dynamo's DDPOptimizer; FSDP2's and TP's hooks and collectives are traced),
    fullgraph=False as accelerate's default.

The wrapper form (`torch.compile(block)`, an OptimizedModule registered in place of the
block, torchtitan's apply_compile until 2025) and not `block.compile()`: the wrapper's own
forward hooks run outside the compiled frame, so localization (suites/judges/localize.py)
traces a compiled block's output and its gradient there, and never inside it; fullgraph
stays what trainers run, and no rerun without it is needed. What runs inside a compiled
region is not traced: localization names the compiled block (or, under compile=model, the
parameter gradient) where eager names the module inside it.

The reference stays eager: it is the ground truth a compiled run is judged against (a
compiled reference would hide a compile bug that shows on both sides). aot_eager runs the
same ATen ops; inductor fuses and may reorder float sums, as a parallel run's sharded
matmuls and all-reduces do, within the same rounding bound (measured: model_training's
tolerance and localize.ROUNDINGS unchanged; reports/fuzz-models-2026-12-10-compile.md).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

GRAPH_PASSES: list = []
"""Passes over Dynamo's graph before the backend: empty in every real run; a compiler plant
(model_plants.COMPILER_PLANTS) installs one when it is imported with its plant set."""


def compiler_backend(backend: str):
    """The backend a compiled structure's parallel run compiles with: `backend` by name, or
    with GRAPH_PASSES installed, those passes and then it."""
    if not GRAPH_PASSES:
        return backend
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend(backend)

    def passes_then_backend(gm, example_inputs):
        for graph_pass in GRAPH_PASSES:
            graph_pass(gm)
        return inner(gm, example_inputs)
    return passes_then_backend


COMPILED_WHOLE = "_distci_compiled_whole"
"""Set on a model whose every module runs inside one compiled frame (compile=model): the
localization tracer hooks none of them (localize.Tracer)."""


def compile_blocks(holder: nn.Module, s: dict[str, Any]) -> None:
    """Each block of `holder.layers` (a pipeline stage's: those it runs) compiled in place."""
    import torch

    if s["compile"] != "blocks":
        return
    for i, block in enumerate(holder.layers):
        if not isinstance(block, nn.Identity):  # a pipeline stage's blocks it does not run
            holder.layers[i] = torch.compile(block, backend=compiler_backend(s["backend"]), fullgraph=not s["experts"])


def compile_model(model: nn.Module, runnable: nn.Module, s: dict[str, Any]) -> nn.Module:
    """What the step calls, compiled whole under compile=model (else `runnable` as it is)."""
    import torch

    if s["compile"] != "model":
        return runnable
    setattr(model, COMPILED_WHOLE, True)
    return torch.compile(runnable, backend=compiler_backend(s["backend"]))


def graphs() -> int:
    """Graphs Dynamo has compiled in this process so far (a compiled structure whose parallel
    run adds none ran eager: a problem, as the scenario table's "nothing was compiled")."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def not_compiled(s: dict[str, Any], before: int) -> list[str]:
    """The problem of a compiled structure whose run compiled nothing since `before` on any
    rank (a pipeline rank whose stages hold no block compiles nothing: split=first / last).
    A collective: every rank calls it, every rank returns the same."""
    import torch
    import torch.distributed as dist

    if s["compile"] == "none":
        return []
    new = torch.tensor([graphs() - before])
    if dist.is_initialized():
        dist.all_reduce(new)
    return [] if int(new) > 0 else [f"nothing was compiled: compile={s['compile']} ran eager"]
