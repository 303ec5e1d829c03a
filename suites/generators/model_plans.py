"""The TP plans the models generator lays a structure out with, written as trainers write
them (the `plan` feature of model_space; the parallel run only, the reference stays whole).

Vocabulary: a *plan* is what `parallelize_module` takes, module path -> ParallelStyle; a
*module kind* is what a plan entry is written for (an attention projection, a norm, the
embedding, ...). Which style each kind gets, per plan, and where it is from:

| kind | megatron | titan | hf |
|---|---|---|---|
| tok (embedding) | whole | Rowwise(input Replicate, output Shard(1)) | whole |
| attention_norm, norm, model.norm | whole | SequenceParallel() | whole |
| attention | - | PrepareModuleInput((Shard(1), None..), (Replicate(), None..)) | - |
| wq wk wv / wo | Colwise / Rowwise | Colwise / Rowwise(output Shard(1)) | colwise / rowwise |
| ffn (dense) | - | PrepareModuleInput((Shard(1),), (Replicate(),)) | - |
| ffn.w1 / ffn.w2 | Colwise / Rowwise | Colwise / Rowwise(output Shard(1)) | colwise / rowwise |
| ffn (MoE, or w1 whole) | - | input Shard(1) -> Replicate local, output Replicate -> Shard(1) | - |
| experts.N.w1 / .w2 | Colwise / Rowwise | Colwise / Rowwise | colwise / rowwise |
| router | whole | whole | whole |
| output head | whole | Colwise(input Shard(1), output Shard(-1) or Replicate) | colwise_rep |
| mtp.norm / mtp.proj | whole | SequenceParallel / Colwise(input, output Shard(1)) | whole |

- megatron: Megatron-LM's column/row pairs (the generator's plan before these).
- titan: torchtitan's `apply_tp` (llama3, qwen3 and deepseek_v3 parallelize.py as of
  2025-26): the embedding RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
  SequenceParallel norms, PrepareModuleInput before attention (the rope cache a None
  layout, as freqs_cis) and the feed-forward, wo / w2 RowwiseParallel(output_layouts=Shard(1)),
  the head ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1) under
  loss_parallel else Replicate(), use_local_output=not loss_parallel). Its MoE layer
  takes its input as a local Replicate and returns Shard(1) (torchtitan's
  PrepareModuleInputOutput(use_local_input=True)), its router unsharded (NoParallel);
  here the two halves are PrepareModuleInput + PrepareModuleOutput (torch 2.5 has both).
  A projection parallelize_module cannot shard (parametrized, LoRA) stays whole inside
  the same local Replicate -> Shard(1) frame; the MTP module gets what its kinds get
  (a norm, a projection that returns to Shard(1)). A tied head is re-tied after the plan,
  as torchtitan's qwen3 did (suites/runner/tying.py: parallelize_module distributes each
  module's parameter on its own; the embedding's and the head's are both Shard(0)).
- hf: transformers' `base_model_tp_plan` strings through its ParallelInterface
  (integrations/tensor_parallel.py): "colwise" / "rowwise" on q/k/v/o and gate/up/down
  (per expert for Mixtral / Qwen-MoE), `_tp_plan = {"lm_head": "colwise_rep"}`
  (ColwiseParallel(output_layouts=Replicate())); every other module "replicate". It shards
  the head and not the embedding, so a tied pair cannot stay one parameter under it
  (model_space's rule).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

PLANS = ("megatron", "titan", "hf")


def _shardable(linear: Any) -> bool:
    """parallelize_module shards an nn.Linear's own weight: not a parametrized or LoRA one."""
    return isinstance(linear, nn.Linear) and not nn.utils.parametrize.is_parametrized(linear)


def _inner(block: nn.Module) -> nn.Module:
    """The block under a checkpoint wrapper (AC wraps before the plan is applied here)."""
    return getattr(block, "_checkpoint_wrapped_module", block)


def apply_plan(model: nn.Module, mesh: Any, plan: str, loss_parallel: bool) -> None:
    """Lays `model` (a model_structures.StructureModel) out over the 1-D TP `mesh`."""
    if plan not in PLANS:
        raise ValueError(f"plan {plan!r}: plans are {', '.join(PLANS)}")
    from torch.distributed.tensor.parallel import parallelize_module

    if plan == "titan":
        _titan(model, mesh, loss_parallel)
        if model.structure["tie"] and model.tok is not None and model.output is not None:
            model.output.weight = model.tok.weight  # parallelize_module unties; trainers re-tie (runner/tying.py)
        return
    if plan == "hf" and model.output is not None:  # _tp_plan = {"lm_head": "colwise_rep"}
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel

        parallelize_module(model.output, mesh, ColwiseParallel(output_layouts=Replicate()))
    for block in _running(model):
        parallelize_module(_inner(block), mesh, _pairs(_inner(block)))


def _running(model: nn.Module) -> list[nn.Module]:
    """The blocks `model` runs: every one, or a pipeline stage's (pp_tp: the plan is applied
    to each stage module, as torchtitan's parallelize runs on each; the ends a stage lacks
    are None and get no entry)."""
    return [model.layers[i] for i in model.running]


def _pairs(block: nn.Module, rowwise_output: Any = None) -> dict[str, Any]:
    """The column/row pairs of one block: attention's and every shardable feed-forward's."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def rowwise() -> Any:
        return RowwiseParallel() if rowwise_output is None else RowwiseParallel(output_layouts=rowwise_output)

    out: dict[str, Any] = {}
    if block.attention is not None:
        out.update({f"attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")})
        out["attention.wo"] = rowwise()
    if hasattr(block.ffn, "experts"):  # LoopMoE: every routed expert, and the shared one
        experts = [(f"ffn.experts.{e}", x) for e, x in enumerate(block.ffn.experts)]
        if block.ffn.shared_expert is not None:
            experts.append(("ffn.shared_expert", block.ffn.shared_expert))
    else:
        experts = [("ffn", block.ffn)]
    for name, expert in experts:
        if _shardable(expert.w1) and _shardable(expert.w2):
            out[f"{name}.w1"], out[f"{name}.w2"] = ColwiseParallel(), RowwiseParallel()
    if rowwise_output is not None and "ffn.w2" in out:
        out["ffn.w2"] = rowwise()
    return out


def _titan(model: nn.Module, mesh: Any, loss_parallel: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                                   RowwiseParallel, SequenceParallel, parallelize_module)

    top: dict[str, Any] = {}
    if model.tok is not None:
        top["tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.output is not None:
        top["norm"] = SequenceParallel()
        top["output"] = ColwiseParallel(input_layouts=Shard(1),
                                        output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                        use_local_output=not loss_parallel)
    if model.mtp is not None:
        top["mtp.norm"] = SequenceParallel()
        top["mtp.proj"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(1))
    if top:
        parallelize_module(model, mesh, top)
    for wrapped in _running(model):
        block = _inner(wrapped)
        entries = {"norm": SequenceParallel()}
        if block.attention is not None:
            rope = (None, None) if block.buffer == "rope" else ()
            entries["attention_norm"] = SequenceParallel()
            entries["attention"] = PrepareModuleInput(input_layouts=(Shard(1), *rope),
                                                      desired_input_layouts=(Replicate(), *rope))
        pairs = _pairs(block, rowwise_output=Shard(1))
        entries.update(pairs)
        if "ffn.w1" in pairs:  # the dense feed-forward, sharded
            entries["ffn"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        else:  # MoE or a projection left whole: a local Replicate in, Shard(1) out
            entries["ffn"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                use_local_output=True)
            parallelize_module(block.ffn, mesh, PrepareModuleOutput(output_layouts=(Replicate(),),
                                                                    desired_output_layouts=(Shard(1),)))
        parallelize_module(block, mesh, entries)
