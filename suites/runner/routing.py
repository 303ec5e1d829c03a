"""MoE routing: recording where tokens went, and steering the router to its edges.

Recording: a pre-hook on every MoE block counts tokens per expert in every microbatch
it sees, keyed by (step, block, global microbatch), so the parallel run's routing can be
compared with the reference's (checks.compare_routing). Steering: the `routing` column
makes an expert get no token in the first / a middle / the last microbatch of every
step, or sends every token to one expert, by adding an offset to the router's logits
(-inf bans an expert, a large value forces one); the reference and the parallel run
steer by the same global microbatch index, so both see the same edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

EDGE_EXPERT = 1
"""The expert the empty_* edges starve: one the router's bias would otherwise feed."""
FORCED_EXPERT = 0
FORCE_LOGIT = 30.0


@dataclass
class RoutingClock:
    """Where a routing hook is: the step, the global index of the microbatch it sees
    first, and into how many microbatches its input splits."""

    step: int = 0
    chunk: int = 0
    parts: int = 1
    on: bool = True
    """Off for the eval forward: only training steps are compared."""


def _value(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


NEAR_TIE_RECORDED = 0.05
"""Relative top-k margins below this are recorded (checks.compare_routing picks the bound)."""


def top_k_margins(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Per token, how far its k-th chosen expert's logit lies above the best one left out,
    relative to the token's largest finite |logit|: the change of logits that flips it.
    inf where no expert is left to flip to (banned ones are -inf)."""
    if logits.shape[-1] <= k:
        return torch.full(logits.shape[:-1], float("inf"))
    top = logits.topk(k + 1, dim=-1).values
    gap = top[..., k - 1] - top[..., k]
    scale = logits.masked_fill(~torch.isfinite(logits), 0).abs().amax(-1).clamp_min(1e-12)
    return torch.where(torch.isfinite(top[..., k]), gap / scale, torch.full_like(gap, float("inf")))


def _routing_hook(record: Any, block: int, clock: RoutingClock):
    def hook(module, inputs) -> None:
        if not clock.on:
            return
        with torch.no_grad():
            for i, part in enumerate(_value(inputs[0]).chunk(clock.parts, dim=0)):
                flat = part.reshape(-1, part.shape[-1])
                _, chosen = module.route(flat)
                counts = torch.bincount(_value(chosen).flatten().cpu(), minlength=len(module.experts)).tolist()
                key = (clock.step, block, clock.chunk + i)
                record.expert_tokens.append(counts)
                record.routing[key] = tuple(counts)
                margins = top_k_margins(_value(module.router_logits(flat)).cpu(), module.top_k)
                record.route_margins[key] = tuple(sorted(m for m in margins.tolist() if m < NEAR_TIE_RECORDED))
    return hook


def watch_routing(model: nn.Module, record: Any, clock: RoutingClock) -> None:
    """Counts tokens per expert in every microbatch of every MoE block (eager)."""
    for block, layer in enumerate(model.layers.values()):
        layer.feed_forward.register_forward_pre_hook(_routing_hook(record, block, clock))


def gather_routing(record: Any, dp_size: int, dp_group: Any) -> None:
    """Every data-parallel rank's routing into one table (each rank saw its own microbatches)."""
    import torch.distributed as dist

    if dp_size == 1:
        return
    tables: list[Any] = [None] * dp_size
    dist.all_gather_object(tables, (record.routing, record.route_margins), group=dp_group)
    for routing, margins in tables:
        record.routing.update(routing)
        record.route_margins.update(margins)


def edge_chunk(edge: str, chunks: int) -> int | None:
    """The global microbatch the `empty_*` edge starves EDGE_EXPERT in (None: none)."""
    return {"empty_first": 0, "empty_middle": chunks // 2, "empty_last": chunks - 1}.get(edge)


def steer(model: nn.Module, edge: str, chunks: int, clock: RoutingClock) -> None:
    """Makes every MoE block's router take the edge: its logits get an offset per
    microbatch (the clock says which one runs)."""
    if edge == "natural":
        return
    starved = edge_chunk(edge, chunks)

    def offset(n_experts: int) -> torch.Tensor | None:
        if not clock.on:  # the eval forward routes naturally, as the reference's does
            return None
        if edge == "one_expert":
            out = torch.zeros(n_experts)
            out[FORCED_EXPERT] = FORCE_LOGIT
            return out
        if clock.chunk == starved:
            out = torch.zeros(n_experts)
            out[EDGE_EXPERT] = float("-inf")
            return out
        return None

    for layer in model.layers.values():
        layer.feed_forward.steer = offset


def edge_problems(reference: Any, edge: str, chunks: int) -> list[str]:
    """Whether the reference's routing shows the edge the row asks for (else the row
    tests nothing new)."""
    if edge == "natural" or not reference.routing:
        return []
    problems = []
    starved = edge_chunk(edge, chunks)
    for (step, block, chunk), counts in sorted(reference.routing.items()):
        if starved is not None:
            if chunk == starved and counts[EDGE_EXPERT]:
                problems.append(f"routing edge {edge}: expert {EDGE_EXPERT} got {counts[EDGE_EXPERT]} tokens in "
                                f"step {step} block {block} microbatch {chunk}, where it must get none")
        elif edge == "one_expert" and counts[FORCED_EXPERT] != sum(counts) // 2:
            problems.append(f"routing edge one_expert: expert {FORCED_EXPERT} got {counts[FORCED_EXPERT]} of "
                            f"{sum(counts) // 2} tokens in step {step} block {block} microbatch {chunk}")
    return problems
