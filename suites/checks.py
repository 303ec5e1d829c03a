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

from . import tying
from .model_args import ModelArgs
from .models import sharded_weights
from .parallelize import FSDP_LAYOUTS
from .scenario_record import DDP_BUCKET_MB, DDP_LAYOUTS, MAX_VARLEN_GRAPHS_PER_REGION, Scenario
from .tolerances import Tolerance
from .uneven import uneven_problems

MAX_LISTED = 100  # the known-issues registry must see every problem to explain a failure

SCALED_MM = ("aten::_scaled_mm",)
FUSED_AG_MM = ("symm_mem::fused_all_gather_matmul", "symm_mem::fused_all_gather_scaled_matmul")
FUSED_MM_RS = ("symm_mem::fused_matmul_reduce_scatter", "symm_mem::fused_scaled_matmul_reduce_scatter")
FUSED_OPTIMIZER_OPS = {"sgd": "aten::_fused_sgd_", "adamw": "aten::_fused_adamw_"}
"""The fused kernel one optimizer step of `optim` runs (one call per parameter group)."""
FOREACH_OP_PREFIX = "aten::_foreach_"
FLOAT8_MMS_PER_LINEAR = {"tensorwise": 3, "rowwise": 3, "rowwise_with_gw_hp": 2}
"""Scaled matmuls one Float8Linear runs per training step: output, grad_input, grad_weight
(rowwise_with_gw_hp keeps grad_weight in high precision)."""


def sqnr(ref: torch.Tensor, actual: torch.Tensor, signal_floor: float = 0.0) -> float:
    """Signal-to-quantization-noise ratio in dB, as torchao's compute_error: inf when equal.
    `signal_floor`: the signal is at least this (see bias_floors)."""
    ref = ref.double()
    noise = torch.linalg.vector_norm(ref - actual.double())
    signal = max(torch.linalg.vector_norm(ref), torch.tensor(signal_floor, dtype=torch.float64))
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return float(20 * torch.log10(signal / noise))


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def check_numerics(ref, run, tol: Tolerance) -> list[str]:
    """Losses and gradients of `run` against `ref` (TrainRecords), step by step; then the
    eval forward's loss and logits when the scenario has one."""
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
    problems.extend(_norm_problems(ref, run, tol))
    problems.extend(loss_scale_problems(ref, run))
    skipped = skipped_steps(ref)
    rerouted, routing_problems = compare_routing(ref, run, tol)
    problems.extend(routing_problems)
    for step, (grads, ref_grads) in enumerate(zip(run.grads, ref.grads)):
        if step in rerouted:
            print(f"distci: step {step}: gradients not compared: {rerouted[step]}")
            continue
        if step in skipped:  # overflowed on purpose: inf in both; the loss scales judge the step
            continue
        missing = sorted(set(ref_grads) - set(grads))
        extra = sorted(set(grads) - set(ref_grads))
        if missing or extra:
            problems.append(f"step {step}: parameters differ from the reference: missing {missing}, extra {extra}")
        floors = bias_floors(ref_grads)
        for name in sorted(set(grads) & set(ref_grads)):
            problems.extend(f"step {step}: {name}: {p}"
                            for p in _grad_problems(grads[name], ref_grads[name], tol, floors.get(name, 0.0)))
    if ref.eval_loss is not None:
        problems.extend(_eval_problems(ref, run, tol))
    problems.extend(export_problems(run))
    return problems


def skipped_steps(record) -> set[int]:
    """The steps a loss-scaled run's GradScaler skipped: its scale fell after them (it
    starts at step.INIT_SCALE and halves on each overflow)."""
    from .step import INIT_SCALE

    before = [INIT_SCALE, *record.loss_scales]
    return {i for i, after in enumerate(record.loss_scales) if after < before[i]}


def loss_scale_problems(ref, run) -> list[str]:
    """A loss-scaled (fp16) run's GradScaler must skip exactly the steps the reference's
    skips (the loss spike's, whose gradients overflow float16) and no other, on every
    rank: its scale after each step must be the reference's. A rank whose scaler missed
    the overflow steps with inf gradients; one that saw an overflow the others did not
    skips alone, and the ranks' weights part for good."""
    if not ref.loss_scales and not run.loss_scales:
        return []
    if run.loss_scales != ref.loss_scales:
        return [f"loss scale after each step {run.loss_scales} vs reference {ref.loss_scales}: the GradScaler "
                f"skipped steps {sorted(skipped_steps(run))}, the reference {sorted(skipped_steps(ref))}"]
    if not skipped_steps(ref):
        return ["the reference skipped no step: the loss spike did not overflow float16, so the row tests no skip"]
    return []


def export_problems(run) -> list[str]:
    """The full state dict the run exports (checkpoint.full_state_dict) must be what it
    trained: every parameter, at its full shape and dtype, equal to the trained one
    gathered with full_tensor(). Both gather the same shards, so any difference (a shard
    in the wrong place, a missing parameter, a cast) is the export path's."""
    if run.exported is None or run.trained is None:
        return []
    problems = [f"export: {name} is missing from the full state dict" for name in sorted(set(run.trained) - set(run.exported))]
    for name in sorted(set(run.trained) & set(run.exported)):
        want, got = run.trained[name], run.exported[name]
        if hasattr(got, "full_tensor") or hasattr(got, "to_local"):
            problems.append(f"export: {name} is exported as a {type(got).__name__}, not a plain tensor")
        elif tuple(got.shape) != tuple(want.shape):
            problems.append(f"export: {name} has shape {tuple(got.shape)}, trained {tuple(want.shape)}")
        elif got.dtype != want.dtype:
            problems.append(f"export: {name} is exported in {got.dtype}, trained in {want.dtype}")
        elif not torch.equal(got, want):
            diff = (got.double() - want.double()).abs().max().item()
            problems.append(f"export: {name} differs from the trained parameter (max |diff| {diff:.3g})")
    return problems


def _norm_problems(ref, run, tol: Tolerance) -> list[str]:
    """The total gradient norm clipping measured, against the reference's: relative error
    within what the gradient SQNR bound allows (60 dB: 1e-3)."""
    if not ref.grad_norms:
        return []
    if len(run.grad_norms) != len(ref.grad_norms):
        return [f"clipping measured {len(run.grad_norms)} gradient norms, the reference {len(ref.grad_norms)}"]
    rtol = 10 ** (-tol.grad_min_sqnr / 20)
    return [f"step {step}: total gradient norm {a:.6g} vs reference {b:.6g} (relative error > {rtol:.2g})"
            for step, (a, b) in enumerate(zip(run.grad_norms, ref.grad_norms))
            if not math.isfinite(a) or abs(a - b) > rtol * abs(b)]


def _eval_problems(ref, run, tol: Tolerance) -> list[str]:
    if run.eval_loss is None:
        return ["the eval step did not run"]
    problems = []
    a, b = run.eval_loss, ref.eval_loss
    if not math.isfinite(a) or abs(a - b) > tol.loss_atol + tol.loss_rtol * abs(b):
        problems.append(f"eval: loss {a:.7g} vs reference {b:.7g}")
    if run.eval_logits is None or run.eval_logits.shape != ref.eval_logits.shape:
        problems.append("eval: logits missing or of another shape than the reference's")
    else:
        db = sqnr(ref.eval_logits, run.eval_logits)
        if db < tol.grad_min_sqnr:
            problems.append(f"eval: logits SQNR {db:.1f} dB < {tol.grad_min_sqnr:g} dB")
    return problems


MAX_REROUTED_STEPS = 1
"""Steps of a run whose routing may differ from the reference's beyond its near-ties (then
only the loss is judged)."""
MAX_REROUTED_FRACTION = 0.01
"""Of a block's token-to-expert assignments in one step, at most this many may differ
beyond its near-ties."""


def near_ties(ref, run, key: tuple[int, int, int], margin: float) -> int:
    """Tokens of one routing key whose top-k choice lies within `margin` (relative, see
    routing.top_k_margins) of flipping, in the reference or in the run: the most
    assignments rounding alone may move there."""
    return max(sum(m < margin for m in record.route_margins.get(key, ())) for record in (ref, run))


def compare_routing(ref, run, tol: Tolerance | None = None) -> tuple[dict[int, str], list[str]]:
    """Where the parallel run routed tokens to other experts than the reference did.

    Routing is discontinuous: a token whose top-k router logits lie within rounding picks
    another expert, and that expert's gradient (and the router's) is then wholly another
    sum, however correct the run is. So a step whose per-expert token counts differ is
    judged by its loss only. Moves up to the block's near-ties (tokens within
    `tol.route_tie_margin` of flipping, in either run) are rounding and free; beyond them
    at most MAX_REROUTED_STEPS steps may move, each at most MAX_REROUTED_FRACTION of a
    block's assignments (at least one token). A broken router, a dropped token or a
    misrouted all-to-all moves far more than the near-ties and fails; bf16, whose
    rounding flips a near-tie in most steps, does not.
    Returns ({step: what moved}, problems); empty when either run did not record routing.
    """
    shared = sorted(set(ref.routing) & set(run.routing))
    if not shared:
        return {}, []
    margin = tol.route_tie_margin if tol is not None else 0.0
    moved: dict[tuple[int, int], int] = {}
    slots: dict[tuple[int, int], int] = {}
    ties: dict[tuple[int, int], int] = {}
    for key in shared:
        a, b = run.routing[key], ref.routing[key]
        step, block = key[0], key[1]
        moved[step, block] = moved.get((step, block), 0) + sum(abs(x - y) for x, y in zip(a, b)) // 2
        slots[step, block] = slots.get((step, block), 0) + sum(b)
        ties[step, block] = ties.get((step, block), 0) + near_ties(ref, run, key, margin)
    missing = sorted(set(ref.routing) - set(run.routing))
    problems = [f"routing: the run recorded no routing for (step, block, microbatch) {missing[:4]}"] if missing else []
    rerouted: dict[int, str] = {}
    beyond_ties: set[int] = set()
    for (step, block), n in sorted(moved.items()):
        if not n:
            continue
        budget = max(1, int(MAX_REROUTED_FRACTION * slots[step, block]))
        tied = ties[step, block]
        what = (f"block {block}: {n} of {slots[step, block]} token-expert assignments differ from the reference's"
                + (f" ({tied} near-tie tokens)" if tied else ""))
        rerouted[step] = f"{rerouted[step]}; {what}" if step in rerouted else what
        if n > tied:
            beyond_ties.add(step)
        if n - tied > budget:
            problems.append(f"step {step}: routing: {what} (more than {budget} beyond the near-ties)")
    if len(beyond_ties) > MAX_REROUTED_STEPS:
        problems.append(f"routing differs from the reference beyond its near-ties in {len(beyond_ties)} steps "
                        f"{sorted(beyond_ties)} (at most {MAX_REROUTED_STEPS} may: rounding moves a token now and "
                        f"then, not every step)")
    return rerouted, problems


def check_routing(ref) -> list[str]:
    """A MoE reference must exercise what real routers do: an imbalanced load in which
    some expert gets no token in some microbatch (the empty-expert path), while every
    expert gets tokens somewhere (so every expert's gradient is compared)."""
    if not ref.expert_tokens:
        return []
    problems = []
    counts = torch.tensor(ref.expert_tokens)
    if not bool((counts == 0).any()):
        problems.append(f"routing: every expert got tokens in every microbatch (min {int(counts.min())}): "
                        "the empty-expert path was not exercised")
    starved = [e for e in range(counts.shape[1]) if not bool(counts[:, e].any())]
    if starved:
        problems.append(f"routing: experts {starved} never got a token: their gradients are not tested")
    return problems


def bias_floors(ref_grads: dict[str, torch.Tensor | None]) -> dict[str, float]:
    """The signal floor of each bias gradient: its weight's gradient norm per input,
    ||dW|| / sqrt(fan_in).

    A bias gradient is the sum of its per-token output gradients, and those can cancel: a
    MoE router's bias gradient sums to zero over the experts, and one step of a torch 2.13.0
    bf16 row had it at 1/6 of its usual norm while its rounding noise stayed put (18.3 dB;
    34.4 dB against this floor). The weight's gradient sums the same output gradients
    times the inputs, which do not cancel so, and says how large they are. A dropped bias
    gradient still fails wherever it is over a tenth of that scale at a 20 dB bound (it was
    a sixth in that step: 15.6 dB); a doubled or sign-flipped one fails the same way."""
    floors = {}
    for name, g in ref_grads.items():
        weight = ref_grads.get(name[: -len("bias")] + "weight") if name.endswith(".bias") else None
        if g is not None and weight is not None and weight.dim() == 2 and weight.shape[0] == g.numel():
            floors[name] = float(torch.linalg.vector_norm(weight.double())) / math.sqrt(weight.shape[1])
    return floors


def _grad_problems(g: torch.Tensor | None, r: torch.Tensor | None, tol: Tolerance,
                   signal_floor: float = 0.0) -> list[str]:
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
    db = sqnr(r, g, signal_floor)
    if db < tol.grad_min_sqnr:
        zero = " (the gradient is all zero)" if not bool(g.any()) else ""
        floor = " (against its weight's gradient per input)" if signal_floor > float(r.norm()) else ""
        out.append(f"gradient SQNR {db:.1f} dB{floor} < {tol.grad_min_sqnr:g} dB{zero}")
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
    graph_breaks: int | None = 0
    """Most graph breaks (None: not judged, where the graph count bounds them instead)."""
    min_calls_per_step: int = 0
    """Compiled-graph runs each step must show (0 for a step: it ran eager)."""
    eval_graphs: int | None = None
    """Most new graphs the eval forward may compile (a grad-mode guard: one per region)."""
    fsdp_all_gathers: int | None = None
    fsdp_reduce_scatters: int | None = None
    fsdp_gradient_reduce_scatters: int | None = None
    """c10d reduce-scatter calls FSDP2 must issue in the last step (grad_sync=last: one per
    unit, the last microbatch's; never one per microbatch)."""
    float8_all_gather_weights: int = 0
    trainable: tuple[str, ...] | None = None
    """Exactly these parameters require grad after parallelize / fully_shard / compile and
    after the last step (what the `train` column freezes stays frozen, the rest trains)."""
    fsdp_param_dtype: str | None = None
    """The dtype every FSDP2 parameter all-gather must move (the policy's param_dtype)."""
    fsdp_reduce_dtype: str | None = None
    """The dtype every FSDP2 gradient reduce-scatter / all-reduce must run in (reduce_dtype)."""
    ddp_all_reduce_dtype: str | None = None
    """ddp / replicate: every gradient bucket is all-reduced `ddp_syncs` times in the last
    step, in this dtype."""
    ddp_syncs: int = 1
    """Microbatches of a step that all-reduce: 1 under grad_sync=last (no_sync), else accum."""
    default_placement: str | None = None
    """Prefix every parameter's placement must start with (FSDP2: `S0`, sharded on dp)."""
    min_scaled_mm: int = 0
    forbid_scaled_mm: bool = False
    post_grad_scaled_mm: bool = False
    fused_async_tp: bool = False
    float8_linears: int = 0
    sharded: dict[str, int] = field(default_factory=dict)
    optimizer_impl: str | None = None
    """`foreach` / `fused`: the kernels the last optimizer step must show (None: not judged)."""
    optim: str = "sgd"
    tied: tuple[str, ...] = ()  # moments at which output and embedding must hold one parameter (tying.py)
    uneven: str | None = None  # the layout that must shard some parameter unevenly (uneven.py)


FSDP_ALL_GATHER = "FSDP::all_gather"
FSDP_REDUCE_SCATTER = "FSDP::post_backward_reduce"
"""FSDP2's own profiler labels, one per unit and collective (`FSDP::all_gather (layers.0)`,
the root's without a name): eager DTensor TP collectives use the same c10d ops, so the
op names cannot tell FSDP's from TP's on a 2-D mesh."""


def _count_labelled(ops: Counter, label: str) -> int:
    return sum(n for name, n in ops.items() if name == label or name.startswith(label + " ("))


def block_graphs(n_layers: int) -> tuple[int, int]:
    """Graphs Dynamo compiles for n identical per-block torch.compile'd modules.

    One per block (our model on CPU, torch 2.5.1 .. 2.13.0), or fewer when Dynamo reuses
    one block's graph for its identical siblings (our model on CUDA with torch 2.11,
    torchtitan's llama3 blocks on 2.14.1). A block that ran uncompiled is not caught by
    this count; a model that ran eager is (zero graphs).
    """
    return (1, n_layers)


def final_layout(scenario: Scenario) -> str:
    """The layout the run ends in (what the last step's evidence shows)."""
    return scenario.parallel if scenario.resume == "none" else scenario.resume


def fsdp_units(args: ModelArgs, reshard: bool = True, mode: str = "titan",
               trainable: tuple[str, ...] | None = None) -> tuple[int, int]:
    """(all-gathers, units with a reduce-scatter) of one FSDP2 microbatch, as
    parallelize.apply_fsdp wraps: every block plus the root gathers in forward; blocks
    that reshard after forward gather again in backward; a unit whose parameters are
    all frozen has nothing to reduce."""
    from .parallelize import resharded_blocks

    gathers = args.n_layers + 1 + sum(resharded_blocks(args.n_layers, reshard, mode))
    if trainable is None:
        return gathers, args.n_layers + 1
    units = {n.split(".")[1] if n.startswith("layers.") else "root" for n in trainable}
    return gathers, len(units)


def trainable_names(scenario: Scenario) -> tuple[str, ...]:
    """The parameters a correct run of the row trains: all but what `train` freezes."""
    from .models import build_model, is_frozen  # the names only: a tiny CPU build

    return tuple(sorted(n for n, _ in build_model(scenario.model_args, 0).named_parameters()
                        if not is_frozen(n, scenario.train)))


def trainable_bytes(scenario: Scenario, dtype: str) -> int:
    """Bytes of the parameters a correct run trains, in the training dtype."""
    from .models import build_model, is_frozen

    size = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    return size * sum(p.numel() for n, p in build_model(scenario.model_args, 0).named_parameters()
                      if not is_frozen(n, scenario.train))


def ddp_optimizer_graphs(scenario: Scenario, dtype: str) -> tuple[int, int]:
    """Graphs Dynamo's DDPOptimizer splits a whole-model compile of a ddp / replicate row
    into: it buckets the graph's trainable parameters as DDP does (DDP_BUCKET_MB, a 1 MiB
    first bucket) and compiles one graph per bucket. More trainable bytes than one bucket
    must split (at least 2; a bucket may grow past its cap to end at a graph output, so
    fewer than bytes / cap + 1 is allowed); fewer stay one graph."""
    cap = DDP_BUCKET_MB * 1024 * 1024
    total = trainable_bytes(scenario, dtype)
    if total <= cap:
        return (1, 1)
    return (2, total // cap + 1)


def expected_graph(scenario: Scenario, dtype: str | None = None) -> GraphExpectation:
    """The evidence a correct run of `scenario` leaves behind; `dtype`, the device's
    training dtype, sets what FSDP2's collectives move when the row has no mp policy."""
    args = scenario.model_args
    layout = final_layout(scenario)
    exp = GraphExpectation()
    if scenario.compile == "model" and layout in FSDP_LAYOUTS:
        # Not fullgraph: Dynamo breaks the graph at FSDP2's (disabled) hooks, before and
        # after every unit; more pieces than that, or any recompile, is a regression.
        pieces = 2 * (args.n_layers + 1) + 1
        exp.graphs, exp.graph_breaks = (1, pieces), pieces - 1
    elif scenario.compile == "model" and layout in DDP_LAYOUTS:
        # Dynamo breaks in DDP's own forward (its logger; replicate's hooks: 3 and 9 breaks
        # on torch 2.13), whose pieces hold no parameter and compile nothing; a break inside
        # the model adds a graph beyond DDPOptimizer's buckets, which the range bounds.
        exp.graphs, exp.graph_breaks = ddp_optimizer_graphs(scenario, dtype or "float32"), None
    elif scenario.compile == "model":
        exp.graphs = (1, 1)
    elif scenario.compile == "block":
        exp.graphs = block_graphs(args.n_layers)
    if scenario.compiled:
        regions = 1 if scenario.compile == "model" else args.n_layers
        exp.min_calls_per_step = regions * scenario.accum
        if scenario.shapes == "varlen":
            exp.recompiles = (MAX_VARLEN_GRAPHS_PER_REGION - 1) * exp.graphs[1]
        if scenario.eval != "none":
            exp.eval_graphs = exp.graphs[1]
    if scenario.float8 != "none":
        # per block: the attention's 4, then the dense feed-forward's 3, or every expert's 3 and the router
        ffn = 3 * args.n_experts + 1 if args.n_experts else 3
        exp.float8_linears = (4 + ffn) * args.n_layers
        exp.min_scaled_mm = exp.float8_linears * FLOAT8_MMS_PER_LINEAR[scenario.float8]
        exp.post_grad_scaled_mm = scenario.uses_inductor
        if scenario.fsdp_float8_all_gather:
            exp.float8_all_gather_weights = exp.float8_linears
    else:
        exp.forbid_scaled_mm = True
    exp.fused_async_tp = scenario.async_tp
    if scenario.opt_impl in ("foreach", "fused"):
        exp.optimizer_impl, exp.optim = scenario.opt_impl, scenario.optim
    exp.trainable = trainable_names(scenario)
    exp.tied = tying.moments(scenario.resume != "none") if args.tie else ()
    exp.uneven = scenario.parallel if scenario.shard == "uneven" and scenario.world_size > 1 else None
    if layout in FSDP_LAYOUTS:
        mode = scenario.reshard if layout == scenario.parallel else "titan"
        gathers, units = fsdp_units(args, mode=mode, trainable=exp.trainable)
        exp.fsdp_all_gathers = gathers * scenario.accum
        syncs = 1 if scenario.grad_sync == "last" else scenario.accum  # microbatches that reduce
        exp.fsdp_reduce_scatters = units * syncs
        if scenario.grad_sync == "last":
            exp.fsdp_gradient_reduce_scatters = units
        exp.default_placement = "R,S0" if layout == "hsdp" else "S0"
        if scenario.fsdp_float8_all_gather:
            pass  # float8 weights travel as torchao's subclass bytes: not recorded
        elif scenario.mp != "none":
            exp.fsdp_param_dtype, exp.fsdp_reduce_dtype = scenario.compute_dtype, "float32"
        elif dtype is not None:
            exp.fsdp_param_dtype = exp.fsdp_reduce_dtype = dtype
    if layout in ("pp_fsdp", "ep_fsdp"):  # FSDP2 per stage / on two meshes: dtypes and shards, not unit counts
        exp.default_placement = "S0"
        if scenario.mp != "none":
            exp.fsdp_param_dtype, exp.fsdp_reduce_dtype = scenario.compute_dtype, "float32"
        elif dtype is not None:
            exp.fsdp_param_dtype = exp.fsdp_reduce_dtype = dtype
    if layout in DDP_LAYOUTS and dtype is not None:  # autocast (mp) keeps float32 parameters and gradients
        exp.ddp_all_reduce_dtype = "bfloat16" if scenario.ddp_hook == "bf16" else dtype
        exp.ddp_syncs = 1 if scenario.grad_sync == "last" else scenario.accum
    if layout in ("tp", "tp_sp", "pp_tp"):
        exp.sharded = {k: f"S{d}" for k, d in sharded_weights(args).items()}
    elif layout == "fsdp_tp":
        exp.sharded = {k: f"S0,S{d}" for k, d in sharded_weights(args).items()}
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
    if exp.graph_breaks is not None and ev.graph_breaks > exp.graph_breaks:
        problems.append(f"{ev.graph_breaks} graph breaks, expected {exp.graph_breaks}")
    for step, calls in enumerate(ev.graph_calls):
        if calls < exp.min_calls_per_step:
            problems.append(f"step {step} ran {calls} compiled graphs, expected at least {exp.min_calls_per_step}: "
                            "it fell back to eager (a recompile limit, or Dynamo gave up on the frame)")
    if exp.eval_graphs is not None:
        if ev.eval_calls == 0:
            problems.append("the eval forward ran no compiled graph: it fell back to eager")
        if ev.eval_graphs > exp.eval_graphs:
            problems.append(f"the eval forward compiled {ev.eval_graphs} new graphs, expected at most {exp.eval_graphs}")
    if exp.fsdp_all_gathers is not None:
        ag = _count_labelled(ev.runtime_ops, FSDP_ALL_GATHER)
        if ag != exp.fsdp_all_gathers:
            problems.append(f"the last step ran {ag} FSDP all-gathers, expected {exp.fsdp_all_gathers} "
                            "(every unit in forward, the resharded ones again in backward)")
    if exp.fsdp_reduce_scatters is not None:
        rs = _count_labelled(ev.runtime_ops, FSDP_REDUCE_SCATTER)
        if rs != exp.fsdp_reduce_scatters:
            problems.append(f"the last step ran {rs} FSDP reduce-scatters, expected {exp.fsdp_reduce_scatters}")
    if exp.float8_all_gather_weights and ev.float8_all_gather_weights != exp.float8_all_gather_weights:
        problems.append(f"{ev.float8_all_gather_weights} FSDP weights all-gather in float8, expected "
                        f"{exp.float8_all_gather_weights}: the all-gathers move high-precision weights")
    if exp.trainable is not None:
        for when, names in (("after parallelize", ev.trainable), ("after the last step", ev.trainable_end)):
            if names is None:
                continue  # evidence built by hand: not recorded
            extra = sorted(set(names) - set(exp.trainable))
            missing = sorted(set(exp.trainable) - set(names))
            if extra:
                problems.append(f"frozen parameters require grad: {extra} ({when})")
            if missing:
                problems.append(f"parameters that train do not require grad: {missing} ({when})")
    problems.extend(_collective_dtype_problems(exp, ev.collectives))
    problems.extend(_ddp_all_reduce_problems(exp, ev))
    if exp.fsdp_gradient_reduce_scatters is not None:
        from .collectives import FSDP_REDUCE_SCATTER_OPS, calls_of

        rs = calls_of(ev.collectives, FSDP_REDUCE_SCATTER_OPS)
        if rs != exp.fsdp_gradient_reduce_scatters:
            problems.append(f"the last step issued {rs} gradient reduce-scatters, expected "
                            f"{exp.fsdp_gradient_reduce_scatters} (one per FSDP2 unit: grad_sync=last reduces the "
                            "last microbatch only)")
    problems.extend(_optimizer_problems(exp, ev.optimizer_ops))
    problems.extend(tying.tie_problems(exp.tied, ev.tied) + uneven_problems(exp.uneven, ev.uneven))
    if ev.frozen_with_grad:
        problems.append(f"frozen parameters got a gradient: {ev.frozen_with_grad}")
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
        for suffix, want in exp.sharded.items():
            if name.endswith(suffix) and placement != want:
                problems.append(f"{name} is {placement}, the plan places it {want}")
        if exp.default_placement and not placement.startswith(exp.default_placement):
            problems.append(f"{name} is {placement}, FSDP2 shards every parameter {exp.default_placement}")
    return problems


def _optimizer_problems(exp: GraphExpectation, ops: Counter) -> list[str]:
    """A foreach / fused row's last optimizer step must run those kernels: a silent
    fallback to the per-parameter loop trains to the same numbers."""
    if exp.optimizer_impl is None:
        return []
    fused = FUSED_OPTIMIZER_OPS[exp.optim]
    n_fused = sum(n for name, n in ops.items() if name == fused)
    n_foreach = sum(n for name, n in ops.items() if name.startswith(FOREACH_OP_PREFIX))
    if exp.optimizer_impl == "fused" and not n_fused:
        return [f"the last optimizer step ran no {fused} (fused=True; it ran {n_foreach} foreach ops): "
                "the fused optimizer did not run"]
    if exp.optimizer_impl == "foreach" and (not n_foreach or n_fused):
        return [f"the last optimizer step ran {n_foreach} {FOREACH_OP_PREFIX}* ops and {n_fused} {fused} "
                "(foreach=True): the foreach optimizer did not run"]
    return []


def _collective_dtype_problems(exp: GraphExpectation, collectives: Counter) -> list[str]:
    """FSDP2's all-gathers in param_dtype, its gradient reductions in reduce_dtype."""
    from .collectives import FSDP_ALL_GATHER_OPS, FSDP_REDUCE_OPS, dtypes_of

    problems = []
    for what, ops, want in (("parameter all-gathers", FSDP_ALL_GATHER_OPS, exp.fsdp_param_dtype),
                            ("gradient reductions", FSDP_REDUCE_OPS, exp.fsdp_reduce_dtype)):
        if want is None:
            continue
        seen = dtypes_of(collectives, ops)
        if not seen:
            problems.append(f"no FSDP {what} were recorded in the last step (expected them in {want})")
        wrong = {d: n for d, n in seen.items() if d != want}
        if wrong:
            problems.append(f"FSDP {what} ran in {dict(sorted(wrong.items()))}, the MixedPrecisionPolicy says {want}")
    return problems


def _ddp_all_reduce_problems(exp: GraphExpectation, ev) -> list[str]:
    """DDP's reducer: each gradient bucket all-reduced once per synchronizing microbatch of
    the last step (grad_sync=last: its last microbatch only), in the expected dtype."""
    want = exp.ddp_all_reduce_dtype
    if want is None:
        return []
    seen = ev.grad_all_reduces
    calls = sum(seen.values())
    problems = []
    if not calls:
        return [f"no gradient all-reduce was recorded in the last step (expected {ev.ddp_buckets} buckets in {want})"]
    if calls != ev.ddp_buckets * exp.ddp_syncs:
        problems.append(f"the last step ran {calls} gradient all-reduces for DDP's {ev.ddp_buckets} buckets, expected "
                        f"{ev.ddp_buckets * exp.ddp_syncs}: each bucket once per synchronizing microbatch "
                        f"({exp.ddp_syncs}; grad_sync=last: the last one only, under no_sync)")
    wrong = {d: n for d, n in seen.items() if d != want}
    if wrong:
        problems.append(f"DDP gradient all-reduces ran in {dict(sorted(wrong.items()))}, expected {want}")
    return problems


def require(problems: list[str], what: str) -> None:
    """Fails the test with every problem listed (a few, then a count)."""
    if not problems:
        return
    shown = problems[:MAX_LISTED]
    more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    raise AssertionError(f"{what}: {len(problems)} problem(s)\n  " + "\n  ".join(shown) + more)
