"""Float8 training in the programs generator: the `fsdp_f8` layout's conversion, its reference,
and `step=precompute` (distci/program_forms.py, LATER_FORMS_3).

As torchtitan's Float8LinearConverter (`components/quantization/float8.py`) does it: the model is
converted with `convert_to_float8_training` BEFORE it is parallelized, every nn.Linear but the
output head (torchtitan's `filter_fqns=["output"]`) becoming a torchao Float8Linear, tensorwise,
with `enable_fsdp_float8_all_gather=True` (FSDP2 then all-gathers the weights in float8, their
scale from the all-reduced amax of the full weight) and `emulate=True` where no float8 hardware
is (torchtitan's `emulate` for devices below SM89; CPU). `step=precompute` is torchtitan's
`post_optimizer_hook`: `precompute_float8_dynamic_scale_for_fsdp(model)` after the step, one
all-reduce of every weight's amax, whose scale the next all-gathers use.

Why the reference computes per rank, and why it is then judged exactly. Tensorwise dynamic
scaling takes one scale per tensor from its amax: the weight's from the whole weight (the
all-gather all-reduces it, or precompute does), but the input's and the output gradient's from
what the matmul sees, which under FSDP2 is one rank's rows. A full-batch reference scales the
activations by the amax of all rows, the run by each rank's: measured on CPU (torch 2.13.0,
torchao 0.18.0, 2 ranks, width 16) that leaves 20-37 dB of gradient SQNR after one step (every
activation element is rounded to e4m3's 3 mantissa bits at another scale), inside no fp32 bound
and too close to a bug's 0-10 dB to bound honestly. So the reference computes as the ranks do
(as program_precision.mixed_precision_reference does for bfloat16): the same converted model, each
data-parallel rank's rows through it with the buffers as that rank has them, the gradients
averaged. Then every float8 cast sees the same tensor and the same scale on both sides and the
two agree bit for bit (measured: 566-572 dB over 3 steps of SGD, tensorwise with and without
the float8 all-gather and precompute, rowwise too, widths 8 and 16); what is left is float32's
sum order, for which the programs' fp32 tolerance (60 dB) is the bound. A float8 rounding flip
(one element one e4m3 step, 6-12 %, after the sum order moved a value across a rounding
boundary) is not expected at these sizes; one that shows is a find to triage, not a tolerance.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..runner.parallelize import count_float8_linears, float8_config, precompute_float8_scales

BIAS_FREE = ("tp_f8",)
"""Layouts whose blocks' linears carry no bias, as torchtitan's models (the Float8 TP styles' users)
have none. Why: torchao's Float8ColwiseParallel / Float8RowwiseParallel cast the gradient of the
module's OUTPUT to float8 (NoopFwToFloat8BwDynamic in `_prepare_output_fn`), after the bias add,
so a bias's gradient is the column sum of a float8-rounded gradient where one process's
Float8Linear sums the high-precision one: measured 22.7-25.1 dB for every w1 / w2 bias at the first
backward (torch 2.13.0 CPU, width 16, 2 ranks; every other gradient >= 130 dB). That difference
is filed with its own repro (known issue distci-float8-tp-styles-bias-grad); with biases every
tp_f8 program would stop there and reach nothing else."""
RECIPE = "tensorwise"
"""The recipe whose float8 all-gather FSDP2 runs (torchao allows it for tensorwise only)."""
HEAD = "head"
"""The linear left in high precision: the output projection, as torchtitan's filter_fqns."""


def emulated(device_type: str) -> bool:
    """Whether float8 matmuls are emulated: without float8 hardware (CPU, CUDA below SM89),
    as torchtitan's `emulate` setting is used."""
    if device_type != "cuda":
        return True
    return torch.cuda.get_device_capability() < (8, 9)


def convert(model: nn.Module, device_type: str) -> int:
    """Converts `model` in place as torchtitan does before parallelizing; returns how many
    linears became Float8Linear (raises if none did: a silent fallback is a failure)."""
    from torchao.float8 import convert_to_float8_training

    config = dataclasses.replace(float8_config(RECIPE, fsdp_float8_all_gather=True), emulate=emulated(device_type))
    convert_to_float8_training(model, config=config,
                               module_filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn != HEAD)
    count = count_float8_linears(model)
    if count == 0:
        raise RuntimeError("convert_to_float8_training converted no linear of the programs' model")
    return count


def per_rank_reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dp_size: int, rows: int,
                       pieces: int = 1) -> torch.Tensor:
    """One forward and backward of the reference as `dp_size` float8 ranks compute it (module
    docstring): each rank's `rows` rows through `model` with the buffers as they stood before
    the step (every rank's forward moves its own copy alike), the gradients of the ranks' mean
    loss accumulated into `.grad` (FSDP2 averages the ranks' gradients). `pieces` forwards per
    rank, one backward of their mean (fwd_bwd=twice). Returns the mean of the ranks' losses."""
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    losses = []
    for rank in range(dp_size):
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        xs = x[rank * rows:(rank + 1) * rows].chunk(pieces)
        ys = y[rank * rows:(rank + 1) * rows].chunk(pieces)
        loss = sum(F.mse_loss(model(xp), yp) for xp, yp in zip(xs, ys)) / pieces
        (loss / dp_size).backward()
        losses.append(loss.detach())
    return torch.stack(losses).mean()


def precompute(model: nn.Module, plant: Any) -> None:
    """precompute_float8_dynamic_scale_for_fsdp on the run's model (the suites' one call of it),
    or under the f8_local_scale plant each weight's scale from its own shard's amax."""
    if plant.precomputes_local_scale():
        _local_scales(model)
    else:
        precompute_float8_scales(model)


def start_precomputing(p: Any) -> None:
    """`step=precompute`: precompute now and after every later optimizer step, through a step
    post-hook on the run's optimizer (torchtitan registers its converters' post_optimizer_hook
    on its OptimizersContainer). Registered once per optimizer; `hook_again` after new_optim."""
    if not p.precomputes:
        p.precomputes = True
        hook_again(p)
    precompute(p.run.model, p.plant)


def hook_again(p: Any) -> None:
    """Registers the precompute post-hook on the run's (new) optimizer, if the program precomputes:
    a trainer that builds its optimizer again registers its hooks on it again."""
    if p.precomputes:
        model, plant = p.run.model, p.plant
        p.run.opt.register_step_post_hook(lambda *args, **kwargs: precompute(model, plant))


def _local_scales(model: nn.Module) -> None:
    """The f8_local_scale plant (program_plants.py): each float8 weight's precomputed scale from
    the amax of this rank's shard alone, the all-reduce left out."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        local = getattr(weight, "_local_tensor", None)
        if local is None or not hasattr(local, "_precomputed_scale"):
            continue
        amax = local._tensor.detach().abs().max().clamp(min=1e-12).to(torch.float64)
        local._precomputed_scale = (torch.finfo(local._dtype).max / amax).to(torch.float32)
