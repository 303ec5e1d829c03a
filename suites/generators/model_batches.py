"""The batches the models generator feeds a structure, shaped as trainers feed them, and the
loss each side computes from them (the `seq`, `pad` and `loss` features of model_space).

Vocabulary: a *batch* is one accumulation microbatch of the global batch (every rank's rows);
its *length* is its sequence dimension; a *valid token* is a label position that is not
IGNORE_INDEX; a *shard* is one data-parallel rank's (fsdp_tp: one dp_shard group's) rows.

Lengths (`seq`), where they come from:
  - fixed: every batch SEQ long (what the generator fed before these features);
  - odd: ODD long, a length the TP degree (2) does not divide: packed or bucketed data, the
    last partial batch, eval batches; under plan=titan the sequence-parallel Shard(1)
    activations are uneven;
  - one: length 1, a single-token step (generation-style forwards): one TP rank's sequence
    shard is empty;
  - varied: each batch its own length (VARIED, in order): HF Trainer's dynamic padding /
    group_by_length, every batch padded to its own longest sample, so shapes change from
    step to step (and from microbatch to microbatch).

Padding (`pad`): DataCollatorWithPadding / DataCollatorForSeq2Seq's right padding: each row's
own length drawn in 1..length, one row the batch's longest; past it the input is PAD_ID and
the label IGNORE_INDEX (-100), so ranks hold different numbers of valid tokens. Under causal
attention a right-padded row's valid tokens never see its pads, so no attention mask changes
them (T5's decoder the same; its encoder input is left whole).

The loss (`loss`), per batch, on a shard's rows, and what the reference computes on the full
batch so that both define the same step:
  - mean: each shard's mean over its valid tokens, / accum, gradients averaged by the layout
    (DDP, FSDP2): what a loop calling `F.cross_entropy` writes. The reference: the mean over
    the shards of each shard's mean (the full-batch mean when every shard holds as many valid
    tokens, as without padding);
  - tokens: torchtitan's train step: the step's global valid-token count (every batch of the
    step, summed over the data-parallel ranks: `dist_sum` over the batch mesh) divides each
    batch's summed loss; FSDP2's gradient division turned off (torchtitan's
    `disable_fsdp_gradient_division`: `set_gradient_divide_factor(1.0)`), so the gradients
    are summed. The reference: the batch's summed loss over the same count;
  - items: HF Trainer's `num_items_in_batch` (`average_tokens_across_devices`): the same
    count divides the summed loss, which is then multiplied by the data-parallel degree
    (`loss *= num_processes`) because DDP / FSDP2 average the gradients (here the data-parallel
    degree: under fsdp_tp the dp_shard groups, not every rank as HF's num_processes would count
    TP ranks too). The reference: as under tokens.
A pipeline's loss is pp_loss's (model_pipeline.py), its count the pipeline's batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

SEQ = 4
ODD = 5
VARIED = (3, 6, 2, 7, 5)
MAX_SEQ = max(SEQ, ODD, *VARIED)
"""The longest batch: the rope cache covers it (model_structures)."""
IGNORE_INDEX = -100
PAD_ID = 0


def length(structure: dict[str, Any], batch: int) -> int:
    """The sequence length of the run's `batch`-th batch (every step's microbatches, in order)."""
    seq = structure["seq"]
    return {"fixed": SEQ, "odd": ODD, "one": 1}.get(seq) or VARIED[batch % len(VARIED)]


def pad(tokens: torch.Tensor, labels: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Right padding as HF's collators write it: each row its own length in 1..length, one row
    the longest; past it PAD_ID in (the last dim of) the input, IGNORE_INDEX in the labels."""
    rows, seq = labels.shape
    own = torch.randint(1, seq + 1, (rows,), generator=gen)
    own[torch.randint(0, rows, (1,), generator=gen)] = seq
    past = torch.arange(seq)[None, :] >= own[:, None]
    tokens = tokens.clone()
    padded = tokens[:, 1] if tokens.dim() > 2 else tokens  # T5's (encoder, decoder) pair: the decoder's side
    padded[past] = PAD_ID
    return tokens, labels.masked_fill(past, IGNORE_INDEX)


def valid_tokens(labels: torch.Tensor) -> torch.Tensor:
    """The valid tokens of `labels` (int64 scalar), as torchtitan counts them."""
    return (labels != IGNORE_INDEX).sum()


def _ce(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), reduction=reduction)


def parallel_loss(structure: dict[str, Any], logits: Any, labels: torch.Tensor, step_valid: Any,
                  shards: int, accum: int) -> Any:
    """One shard's loss for one batch (`step_valid`: the step's global valid-token count)."""
    if structure["loss"] == "mean":
        return _ce(logits, labels) / accum
    summed = _ce(logits, labels, "sum") / step_valid
    return summed * shards if structure["loss"] == "items" else summed


def reference_loss(structure: dict[str, Any], logits: torch.Tensor, labels: torch.Tensor, step_valid: Any,
                   shards: int, accum: int) -> torch.Tensor:
    """The full batch's loss as the parallel run defines it (module docstring)."""
    if structure["loss"] == "mean":
        parts = zip(logits.chunk(shards), labels.chunk(shards))
        return sum(_ce(x, y) for x, y in parts) / shards / accum
    return _ce(logits, labels, "sum") / step_valid


def recorded(structure: dict[str, Any], averaged: torch.Tensor, shards: int) -> torch.Tensor:
    """The step's loss from the ranks' average of their own: under tokens the shards' losses
    add up to the step's (each is its part of one sum); under mean and items they average."""
    return averaged * shards if structure["loss"] == "tokens" else averaged


def divide_by_sum(model: torch.nn.Module) -> None:
    """torchtitan's `disable_fsdp_gradient_division`: every FSDP2 unit sums its gradients (a
    torch without `set_gradient_divide_factor` raises, as torchtitan's call would: skipping it
    would leave the gradients averaged, a wrong number instead of a refusal)."""
    for module in model.modules():
        if hasattr(module, "set_reshard_after_backward"):  # an FSDP2 unit (FSDPModule)
            module.set_gradient_divide_factor(1.0)
