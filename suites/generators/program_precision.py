"""The programs generator's reference at FSDP2's bfloat16 mixed precision (layout fsdp_mp):
each data-parallel rank's rows computed as that rank computes them, so a correct fsdp_mp run
differs from it only by the order of float32 sums (mixed_precision_reference says why).

Why a module of its own: suites/generators/programs.py runs every layout's twins; this is one
layout's reference arithmetic, and programs.py stays under the 500-line ceiling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def bf16_forward(model: nn.Module, x: torch.Tensor, state: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """`model`'s forward as FSDP2's bfloat16 policy runs it (parameters and input cast to
    bfloat16, buffers as they are), its output in float32; `state` the tensors to use
    (default: the parameters cast, the buffers themselves)."""
    from torch.func import functional_call

    if state is None:
        state = {**{n: q.detach().to(torch.bfloat16) for n, q in model.named_parameters()}, **dict(model.named_buffers())}
    return functional_call(model, state, (x.to(torch.bfloat16),)).float()


def mixed_precision_reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dp_size: int, rows: int,
                              pieces: int = 1) -> torch.Tensor:
    """One forward and backward of the single-process reference at the precision of FSDP2's
    mixed-precision policy (bfloat16 parameters and inputs, float32 gradient reduction): each
    data-parallel rank's `rows` rows run on a bfloat16 copy of the parameters, as that rank computes
    them, and the float32 casts of the ranks' gradients are averaged into the float32 `.grad`
    (FSDP2 accumulates and reduces in float32). Returns the mean of the ranks' losses.

    Why: a float32 full-batch reference differs from a bfloat16 run by bfloat16's rounding,
    which no bound holds for once AdamW moves every weight by about its learning rate whatever
    its gradient's size (a near-zero gradient rounded across zero moves its weight the other
    way). Computed as the ranks compute, the reference differs from a correct run only by the
    order of float32 sums, so fsdp_mp is judged at float32's tolerance with every optimizer,
    and a reduction or cast in the wrong precision shows. `pieces` forwards per rank (its rows
    split evenly), one backward of their mean loss (fwd_bwd=twice): autograd sums the pieces'
    bfloat16 gradients before the float32 cast, as it does for the run's unsharded parameters."""
    low = {n: q.detach().to(torch.bfloat16).requires_grad_(q.requires_grad) for n, q in model.named_parameters()}
    trainable = [n for n, q in low.items() if q.requires_grad]
    buffers = dict(model.named_buffers())
    sums: dict[str, torch.Tensor] = {}
    losses = []
    for rank in range(dp_size):
        state = {**low, **{n: b.clone() for n, b in buffers.items()}}
        xs, ys = x[rank * rows:(rank + 1) * rows].chunk(pieces), y[rank * rows:(rank + 1) * rows].chunk(pieces)
        loss = sum(F.mse_loss(bf16_forward(model, xp, state), yp) for xp, yp in zip(xs, ys)) / pieces
        grads = torch.autograd.grad(loss, [low[n] for n in trainable], allow_unused=True) if trainable else ()
        for name, grad in zip(trainable, grads):
            if grad is not None:
                sums[name] = sums[name] + grad.float() if name in sums else grad.float()
        losses.append(loss.detach())
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, total in sums.items():
            grad = total / dp_size
            params[name].grad = grad if params[name].grad is None else params[name].grad + grad
        for name, buffer in buffers.items():  # every rank's forward moved its buffers alike
            buffer.copy_(state[name])
    return torch.stack(losses).mean()
