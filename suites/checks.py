"""The judges: does a TP run match its reference, and did it compile to what we expect?

Every check returns a list of problems (plain sentences) instead of raising, so one run
reports everything that is wrong with it, and the mutation tests can feed a check a
broken run and see it fail without anything raising first. `require()` turns problems
into one AssertionError for pytest.

Graph expectations exist because numbers alone miss silent fallbacks: async TP whose
fusion did not happen, or a Float8 conversion that did not happen, train to the right
loss. So the run must also show the ops the feature is made of.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import torch

from .model_args import ModelArgs
from .models import SHARDED_WEIGHTS
from .scenarios import Scenario, Tolerance

MAX_LISTED = 100  # the known-issues registry must see every problem to explain a failure

SCALED_MM = ("aten::_scaled_mm",)
FUSED_AG_MM = ("symm_mem::fused_all_gather_matmul", "symm_mem::fused_all_gather_scaled_matmul")
FUSED_MM_RS = ("symm_mem::fused_matmul_reduce_scatter", "symm_mem::fused_scaled_matmul_reduce_scatter")
FLOAT8_MMS_PER_LINEAR = {"tensorwise": 3, "rowwise": 3, "rowwise_with_gw_hp": 2}
"""Scaled matmuls one Float8Linear runs per training step: output, grad_input, grad_weight
(rowwise_with_gw_hp keeps grad_weight in high precision)."""


def sqnr(ref: torch.Tensor, actual: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB, as torchao's compute_error: inf when equal."""
    ref = ref.double()
    noise = torch.linalg.vector_norm(ref - actual.double())
    signal = torch.linalg.vector_norm(ref)
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return float(20 * torch.log10(signal / noise))


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def check_numerics(ref, run, tol: Tolerance) -> list[str]:
    """Losses and gradients of `run` against `ref` (TrainRecords), step by step."""
    problems: list[str] = []
    if len(run.losses) != len(ref.losses):
        return [f"ran {len(run.losses)} steps, the reference {len(ref.losses)}"]
    for step, (a, b) in enumerate(zip(run.losses, ref.losses)):
        if not math.isfinite(a):
            problems.append(f"step {step}: loss is {a}")
        elif not math.isfinite(b):
            problems.append(f"step {step}: the reference loss is {b} (the scenario itself is unstable)")
        elif abs(a - b) > tol.loss_atol + tol.loss_rtol * abs(b):
            problems.append(f"step {step}: loss {a:.7g} vs reference {b:.7g} "
                            f"(|diff| {abs(a - b):.3g} > {tol.loss_atol:g} + {tol.loss_rtol:g}*|ref|)")
    for step, (grads, ref_grads) in enumerate(zip(run.grads, ref.grads)):
        missing = sorted(set(ref_grads) - set(grads))
        extra = sorted(set(grads) - set(ref_grads))
        if missing or extra:
            problems.append(f"step {step}: parameters differ from the reference: missing {missing}, extra {extra}")
        for name in sorted(set(grads) & set(ref_grads)):
            problems.extend(f"step {step}: {name}: {p}" for p in _grad_problems(grads[name], ref_grads[name], tol))
    return problems


def _grad_problems(g: torch.Tensor | None, r: torch.Tensor | None, tol: Tolerance) -> list[str]:
    if r is None and g is None:
        return []
    if g is None:
        return ["no gradient (the reference has one)"]
    if r is None:
        return ["has a gradient the reference does not"]
    if g.shape != r.shape:
        return [f"gradient shape {tuple(g.shape)} vs reference {tuple(r.shape)}"]
    if not _finite(g):
        return [f"gradient has {int((~torch.isfinite(g)).sum())} non-finite values"]
    out = []
    db = sqnr(r, g)
    if db < tol.grad_min_sqnr:
        zero = " (the gradient is all zero)" if not bool(g.any()) else ""
        out.append(f"gradient SQNR {db:.1f} dB < {tol.grad_min_sqnr:g} dB{zero}")
    elif tol.grad_max_rel is not None:
        err, scale = (g - r).abs().max().item(), r.abs().max().item()
        if err > tol.grad_max_rel * scale:
            out.append(f"gradient max |diff| {err:.3g} > {tol.grad_max_rel:g} * max|ref| ({scale:.3g})")
    return out


@dataclass
class GraphExpectation:
    """What the TP run's compiler and kernels must show; a range is (min, max) inclusive."""

    graphs: tuple[int, int] = (0, 0)
    recompiles: int = 0
    graph_breaks: int = 0
    min_scaled_mm: int = 0
    forbid_scaled_mm: bool = False
    post_grad_scaled_mm: bool = False
    fused_async_tp: bool = False
    float8_linears: int = 0
    sharded: dict[str, int] = field(default_factory=dict)


def block_graphs(n_layers: int) -> tuple[int, int]:
    """Graphs Dynamo compiles for n identical per-block torch.compile'd modules.

    One per block (our model on CPU, torch 2.5.1 .. 2.13.0), or fewer when Dynamo reuses
    one block's graph for its identical siblings (our model on CUDA with torch 2.11,
    torchtitan's llama3 blocks on 2.14.1). A block that ran uncompiled is not caught by
    this count; a model that ran eager is (zero graphs).
    """
    return (1, n_layers)


def expected_graph(scenario: Scenario, args: ModelArgs) -> GraphExpectation:
    """The evidence a correct run of `scenario` leaves behind."""
    exp = GraphExpectation()
    if scenario.compile == "model":
        exp.graphs = (1, 1)
    elif scenario.compile == "block":
        exp.graphs = block_graphs(args.n_layers)
    if scenario.float8 != "none":
        exp.float8_linears = 7 * args.n_layers
        exp.min_scaled_mm = exp.float8_linears * FLOAT8_MMS_PER_LINEAR[scenario.float8]
        exp.post_grad_scaled_mm = scenario.uses_inductor
    else:
        exp.forbid_scaled_mm = True
    exp.fused_async_tp = scenario.async_tp
    exp.sharded = dict(SHARDED_WEIGHTS)
    return exp


def _count(ops: Counter, names: tuple[str, ...]) -> int:
    return sum(ops.get(n, 0) for n in names)


def check_graph(exp: GraphExpectation, ev) -> list[str]:
    """Judges an Evidence record (suites.training.Evidence) against the expectation."""
    problems: list[str] = []
    lo, hi = exp.graphs
    if not lo <= ev.graphs_after_first_step <= hi:
        if ev.graphs_after_first_step == 0 and lo > 0:
            problems.append("nothing was compiled: the compiled model silently ran eager")
        else:
            problems.append(f"{ev.graphs_after_first_step} graphs compiled in the first step, expected {lo}..{hi}")
    if ev.recompiles > exp.recompiles:
        problems.append(f"{ev.recompiles} recompiles after the first step, expected {exp.recompiles}")
    if ev.graph_breaks > exp.graph_breaks:
        problems.append(f"{ev.graph_breaks} graph breaks, expected {exp.graph_breaks}")
    scaled = _count(ev.runtime_ops, SCALED_MM)
    if exp.float8_linears and ev.float8_linears != exp.float8_linears:
        problems.append(f"{ev.float8_linears} Float8Linear modules after conversion, expected {exp.float8_linears}")
    if exp.min_scaled_mm and scaled < exp.min_scaled_mm:
        problems.append(f"the last step ran {scaled} scaled matmuls (aten::_scaled_mm), expected at least "
                        f"{exp.min_scaled_mm}: Float8 did not happen")
    if exp.forbid_scaled_mm and scaled:
        problems.append(f"the last step ran {scaled} scaled matmuls in a scenario without Float8")
    if exp.post_grad_scaled_mm:
        in_graph = _count(ev.post_grad_ops, SCALED_MM + FUSED_AG_MM + FUSED_MM_RS)
        if not in_graph:
            problems.append("no scaled matmul in inductor's post-grad graphs: Float8 was compiled away")
    if exp.fused_async_tp:
        ag, rs = _count(ev.post_grad_ops, FUSED_AG_MM), _count(ev.post_grad_ops, FUSED_MM_RS)
        if ev.post_grad_graphs == 0:
            problems.append("no post-grad graph was seen: inductor did not compile (async TP cannot have run)")
        # One line per side: the two sides fail for different upstream reasons, and the
        # known-issue registry must explain each line on its own (one entry never hides the other).
        if ag == 0:
            problems.append("async TP did not fuse the all-gather side: 0 fused all-gather matmuls in the "
                            f"post-grad graphs (the reduce-scatter side fused {rs})")
        if rs == 0:
            problems.append("async TP did not fuse the reduce-scatter side: 0 fused matmul reduce-scatters in "
                            f"the post-grad graphs (the all-gather side fused {ag})")
    for name, placement in sorted(ev.placements.items()):
        for suffix, dim in exp.sharded.items():
            if name.endswith(suffix) and placement != f"S{dim}":
                problems.append(f"{name} is {placement}, the plan shards it on dim {dim}")
    return problems


def require(problems: list[str], what: str) -> None:
    """Fails the test with every problem listed (a few, then a count)."""
    if not problems:
        return
    shown = problems[:MAX_LISTED]
    more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    raise AssertionError(f"{what}: {len(problems)} problem(s)\n  " + "\n  ".join(shown) + more)
