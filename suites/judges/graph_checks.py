"""Structural judges: did a run compile, fuse, shard and communicate as a correct run of
its scenario must (GraphExpectation from the row; check_graph against the run's Evidence)?

Graph expectations exist because numbers alone miss silent fallbacks: async TP whose
fusion did not happen, or a Float8 conversion that did not happen, train to the right
loss. So the run must also show the ops the feature is made of. Like every judge, each
check returns problems (sentences) and never raises.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..runner import tying
from ..scenario.model_args import ModelArgs
from ..runner.models import sharded_weights
from ..runner.fsdp import FSDP_LAYOUTS
from ..scenario.record import DDP_BUCKET_MB, DDP_LAYOUTS, MAX_VARLEN_GRAPHS_PER_REGION, Scenario
from ..runner.training import TP_EVIDENCE_LAYOUTS
from ..runner.uneven import uneven_problems

TP_LAYOUTS = ("tp", "tp_sp", "fsdp_tp", "pp_tp")
SCALED_MM = ("aten::_scaled_mm",)
FUSED_AG_MM = ("symm_mem::fused_all_gather_matmul", "symm_mem::fused_all_gather_scaled_matmul")
FUSED_MM_RS = ("symm_mem::fused_matmul_reduce_scatter", "symm_mem::fused_scaled_matmul_reduce_scatter")
FUSED_OPTIMIZER_OPS = {"sgd": "aten::_fused_sgd_", "adamw": "aten::_fused_adamw_"}
"""The fused kernel one optimizer step of `optim` runs (one call per parameter group)."""
FOREACH_OP_PREFIX = "aten::_foreach_"
FLOAT8_MMS_PER_LINEAR = {"tensorwise": 3, "rowwise": 3, "rowwise_with_gw_hp": 2}
"""Scaled matmuls one Float8Linear runs per training step: output, grad_input, grad_weight
(rowwise_with_gw_hp keeps grad_weight in high precision)."""


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
    gathers_before_blocks: tuple[int, ...] | None = None
    """FSDP2 all-gathers issued before each block's first forward of the last step: the root
    unit's and every block's up to this one, and under explicit prefetch the next block's too."""
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
    tp_collective_dtypes: tuple[str, ...] = ()
    """The dtypes TP's functional collectives (and DTensor's redistributes) may move in the
    last step: the compute dtype, and float32 for what the suites keep in float32 (the
    loss, norms). Empty: not judged."""
    tp_collectives_seen: bool = False
    """An eager TP row: its functional collectives must have been recorded at all."""
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
    from ..runner.fsdp import resharded_blocks

    gathers = args.n_layers + 1 + sum(resharded_blocks(args.n_layers, reshard, mode))
    if trainable is None:
        return gathers, args.n_layers + 1
    units = {n.split(".")[1] if n.startswith("layers.") else "root" for n in trainable}
    return gathers, len(units)


def trainable_names(scenario: Scenario) -> tuple[str, ...]:
    """The parameters a correct run of the row trains: all but what `train` freezes."""
    from ..runner.models import build_model, is_frozen  # the names only: a tiny CPU build

    return tuple(sorted(n for n, _ in build_model(scenario.model_args, 0).named_parameters()
                        if not is_frozen(n, scenario.train)))


def trainable_bytes(scenario: Scenario, dtype: str) -> int:
    """Bytes of the parameters a correct run trains, in the training dtype."""
    from ..runner.models import build_model, is_frozen

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
        if not scenario.compiled and scenario.resume == "none" and not scenario.fsdp_float8_all_gather:
            ahead = 2 if scenario.prefetch == "explicit" else 1  # this block's gather, and the next one's
            exp.gathers_before_blocks = tuple(1 + min(i + ahead, args.n_layers) for i in range(args.n_layers))
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
    if layout in TP_LAYOUTS and scenario.float8 == "none" and dtype is not None:
        exp.tp_collective_dtypes = tuple(sorted({scenario.compute_dtype or dtype, "float32"}))
        exp.tp_collectives_seen = not scenario.compiled and layout in TP_EVIDENCE_LAYOUTS
    if layout in ("tp", "tp_sp", "pp_tp"):
        exp.sharded = {k: f"S{d}" for k, d in sharded_weights(args).items()}
    elif layout == "fsdp_tp":
        exp.sharded = {k: f"S0,S{d}" for k, d in sharded_weights(args).items()}
    return exp


def _count(ops: Counter, names: tuple[str, ...]) -> int:
    return sum(ops.get(n, 0) for n in names)


def check_graph(exp: GraphExpectation, ev) -> list[str]:
    """Judges an Evidence record (suites.runner.evidence.Evidence) against the expectation."""
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
    if exp.gathers_before_blocks is not None and tuple(ev.gathers_before_blocks) != exp.gathers_before_blocks:
        problems.append(f"FSDP2 all-gathers issued before each block's forward {tuple(ev.gathers_before_blocks)}, "
                        f"expected {exp.gathers_before_blocks} (each block gathers in its own pre-forward; "
                        "under explicit prefetch the next block's all-gather is issued a block earlier)")
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
    problems.extend(_tp_collective_problems(exp, ev.collectives))
    problems.extend(_ddp_all_reduce_problems(exp, ev))
    if exp.fsdp_gradient_reduce_scatters is not None:
        from ..runner.collectives import FSDP_REDUCE_SCATTER_OPS, calls_of

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
    from ..runner.collectives import FSDP_ALL_GATHER_OPS, FSDP_REDUCE_OPS, dtypes_of

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


def _tp_collective_problems(exp: GraphExpectation, collectives: Counter) -> list[str]:
    """TP's functional collectives (DTensor redistributes) in the dtypes the row computes in."""
    if not exp.tp_collective_dtypes:
        return []
    from ..runner.collectives import functional_dtypes

    seen = functional_dtypes(collectives)
    if not seen and exp.tp_collectives_seen:
        return ["no TP functional collective was recorded in the last step (DTensor's redistributes went unseen)"]
    wrong = {d: n for d, n in seen.items() if d not in exp.tp_collective_dtypes}
    if wrong:
        return [f"TP functional collectives ran in {dict(sorted(wrong.items()))}, expected only "
                f"{', '.join(exp.tp_collective_dtypes)}"]
    return []


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
