"""The single-process reference every parallel run is judged against.

The unsharded model on one process, eager, no AC (with the scenario's Float8 recipe when
it has one: Float8 is judged against Float8, as torchao does), one step per global
batch, with the same loss, clipping, optimizer and schedule (suites/runner/step.py) as the
parallel run; its optimizer always steps with torch's per-parameter loop, so a foreach or
fused row's difference is the parallel kernels' doing. A mixed-precision row's reference computes as FSDP2's bf16 policy does,
microbatch by microbatch, so bf16 routing is judged by bf16 routing; a routing-edge row
steers its router per microbatch as the parallel run does.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.nn as nn

from . import parallelize as par
from . import step as stp
from .models import build_model
from .routing import RoutingClock, steer, watch_routing
from ..scenario.record import SEED, Scenario
from .evidence import TrainRecord, full_grads
from .layout import freeze, torch_dtype


def _chunked_reference(scenario: Scenario) -> bool:
    """Whether the reference runs microbatch by microbatch: bf16 rounding and routing
    edges depend on which microbatch a token is in."""
    return scenario.mp != "none" or scenario.routing != "natural"


def run_reference(scenario: Scenario, device: torch.device, dtype: str) -> TrainRecord:
    """The unsharded model on one process, eager, no AC; Float8 only when the scenario has it."""
    args = scenario.model_args
    model = build_model(args, SEED).to(device=device, dtype=torch_dtype(scenario.train_dtype_override or dtype))
    freeze(model, scenario.train)
    if scenario.float8 != "none":
        par.convert_float8(model, scenario.float8)
    record = TrainRecord()
    clock = RoutingClock(parts=scenario.dp_degree * scenario.accum)
    if args.n_experts and not _chunked_reference(scenario):
        watch_routing(model, record, clock)
    data = stp.batches(scenario)
    parts = stp.new_step_parts(scenario, model, stp.loss_fn(scenario.loss), impl="for_loop")
    for clock.step, (tokens, labels) in enumerate(data):
        parts.opt.zero_grad(set_to_none=scenario.zero_grad == "none")
        if _chunked_reference(scenario):
            loss = _chunked_grads(scenario, model, tokens, labels, device, record, clock, parts.loss,
                                  parts.scaler, clock.step)
        else:
            loss = parts.loss(model(tokens.to(device)), labels.to(device))
            loss.backward()
        stp.unscale(parts)
        if scenario.clip != "none":
            form = "inf" if scenario.clip == "inf" else "norm"  # every other form measures the 2-norm
            record.grad_norms.append(float(stp.clip_grads(list(model.parameters()), form).cpu()))
        record.losses.append(float(loss.detach().float().cpu()))
        record.grads.append(full_grads(model))
        stp.optimizer_step(parts, record=record)
    if scenario.eval != "none":
        clock.on = False
        record.eval_loss, record.eval_logits = stp.evaluate(scenario, model, device, parts.loss)
    return record


def _chunked_grads(scenario: Scenario, model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor,
                   device, record: TrainRecord, clock: RoutingClock, loss_fn: Callable, scaler: Any = None,
                   step: int = 0) -> torch.Tensor:
    """The step microbatch by microbatch, as the data-parallel ranks see it.

    Under mp bf16, as FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32):
    a float32 reference cannot judge a bf16 run of a router (a token whose top-k scores
    lie within bf16 rounding picks another expert, whose gradient then differs wholly),
    so each microbatch runs on a bf16 cast of the float32 parameters (buffers stay
    float32), and its bf16 gradients are cast to float32, summed over microbatches and
    averaged over ranks into the float32 master's `.grad`. Under mp fp16 the same in
    float16, each microbatch's backward scaled by the row's GradScaler (the first one spiked
    at step.SPIKE_STEP), so the master's `.grad` holds scaled gradients (inf where float16
    overflowed) for the scaler to unscale and judge. Routing-edge rows steer the
    router per microbatch. Returns the global loss (the mean over ranks of the
    accumulated loss).
    """
    shadow = copy.deepcopy(model)
    if scenario.mp != "none":
        for p in shadow.parameters():
            p.data = p.data.to(torch_dtype(scenario.compute_dtype))
    shadow_clock = RoutingClock(step=clock.step)
    if scenario.model_args.n_experts:
        watch_routing(shadow, record, shadow_clock)
        steer(shadow, scenario.routing, scenario.dp_degree * scenario.accum, shadow_clock)
    ranks, accum = scenario.dp_degree, scenario.accum
    rows = tokens.shape[0] // (ranks * accum)
    grads: dict[str, torch.Tensor] = {}
    total = torch.zeros((), dtype=torch.float32)
    for chunk in range(ranks * accum):
        shadow_clock.chunk = chunk
        shadow.zero_grad(set_to_none=True)
        part = slice(chunk * rows, (chunk + 1) * rows)
        loss = loss_fn(shadow(tokens[part].to(device)), labels[part].to(device)) / accum
        stp.scaled(loss, scaler, step, chunk == 0).backward()
        total += loss.detach().float().cpu() / ranks
        for name, p in shadow.named_parameters():
            if p.grad is not None:
                g = p.grad.float() / ranks
                grads[name] = grads[name] + g if name in grads else g
    for name, p in model.named_parameters():
        g = grads.get(name)
        # summed in float32, stored in the parameter's dtype: torch checks an assigned grad's
        # dtype against the tensor's (its grad_dtype on 2.10+), so a bf16 reference (mp rows
        # with accumulation) takes its sums as bf16, the dtype its own backward would give
        p.grad = None if g is None else g.to(p.dtype)
    return total
