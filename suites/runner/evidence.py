"""What a parallel run records: per-step losses and full gradients (TrainRecord), what its
compiler, kernels and collectives did (Evidence), the mutations tests plant to prove the
checks bite, and the helpers that read them off a model (full gradients, placements,
executed ops, graph breaks, inductor's post-grad ops).

Gradients are recorded as full float32 CPU tensors under the full model's parameter
names (wrapper prefixes removed, DTensors gathered with full_tensor(), experts from
their owners, pipeline stages from every rank), so one comparison judges every layout.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

from . import parallelize as par

_WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


@dataclass
class TrainRecord:
    """Per-step losses and gradients (float32, on CPU, full/unsharded); eval results; and,
    for MoE runs, tokens per expert per (step, block, microbatch): `expert_tokens` lists
    the counts, `routing` keys them by (step, block, global microbatch index) so the
    parallel run's routing can be compared with the reference's (eager runs only)."""

    losses: list[float] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor | None]] = field(default_factory=list)
    eval_loss: float | None = None
    eval_logits: torch.Tensor | None = None
    expert_tokens: list[list[int]] = field(default_factory=list)
    routing: dict[tuple[int, int, int], tuple[int, ...]] = field(default_factory=dict)
    route_margins: dict[tuple[int, int, int], tuple[float, ...]] = field(default_factory=dict)
    """Per routing key, the near-tie tokens' relative top-k margins (routing.top_k_margins)."""
    grad_norms: list[float] = field(default_factory=list)
    """The total gradient norm clipping measured, per step (clipped rows only)."""
    loss_scales: list[float] = field(default_factory=list)
    """GradScaler's scale after each step (loss-scaled rows only): a step it skipped halves it."""
    lrs: list[list[float]] = field(default_factory=list)
    """Each param group's learning rate after each step's schedule step: the LR the next
    step trains with (a schedule a resume restarted shows here; the last step's update is
    not otherwise seen by any later forward)."""
    trained: dict[str, torch.Tensor] | None = None
    """The parallel model's parameters after the last step, each gathered with full_tensor()
    (CPU, its own dtype), on the rank that also holds `exported`."""
    exported: dict[str, torch.Tensor] | None = None
    """The full state dict the run exports at its end (checkpoint.full_state_dict), as
    rank 0 receives it. None: not exported (a layout outside checkpoint.EXPORTED_LAYOUTS,
    or a rank that receives nothing)."""


@dataclass
class Evidence:
    """What the parallel run's compiler, kernels and collectives did; judged by checks.check_graph."""

    compiled: bool = False
    graphs_after_first_step: int = 0
    graphs_total: int = 0
    graph_breaks: int = 0
    graph_calls: list[int] = field(default_factory=list)
    """Compiled-graph calls (forward) per training step: 0 is a step that ran eager."""
    eval_graphs: int = 0
    eval_calls: int = 0
    post_grad_graphs: int = 0
    post_grad_ops: Counter = field(default_factory=Counter)
    runtime_ops: Counter = field(default_factory=Counter)
    float8_linears: int = 0
    float8_all_gather_weights: int = 0
    placements: dict[str, str] = field(default_factory=dict)
    trainable: list[str] | None = None
    """Parameters that require grad once the model is parallelized and compiled (None:
    not recorded, as in evidence built by hand)."""
    trainable_end: list[str] | None = None
    """... and after the last step (nothing in training may flip requires_grad)."""
    frozen_with_grad: list[str] = field(default_factory=list)
    tied: dict[str, bool] = field(default_factory=dict)
    uneven: dict[str, list[str]] = field(default_factory=dict)
    """Uneven rows: layout -> the parameters whose local shards differ in shape between ranks."""
    """Tie rows: moment (suites/runner/tying.py) -> whether output and embedding held one parameter."""
    collectives: Counter = field(default_factory=Counter)
    """(op, dtype) -> calls of every c10d / functional collective in the last step."""
    grad_all_reduces: Counter = field(default_factory=Counter)
    """dtype -> the process group's all-reduces of gradient buckets (non-scalar tensors) in
    the last step, as the profiler saw them run (DDP's C++ reducer calls no Python
    function the collective wrappers could see)."""
    gathers_before_blocks: list[int] = field(default_factory=list)
    """FSDP2 all-gathers the last step had issued when each block's first forward began, in
    block order (eager FSDP2 rows): explicit prefetch issues the next block's a block earlier."""
    ddp_buckets: int = 0
    """Gradient buckets of a ddp / replicate row's reducer (each all-reduced once a step)."""
    optimizer_ops: Counter = field(default_factory=Counter)
    """Ops (profiler names) the last step's optimizer.step() executed: which kernels the
    `opt_impl` really ran (aten::_fused_adamw_, aten::_foreach_add_, ... or per-tensor ops)."""

    @property
    def recompiles(self) -> int:
        return self.graphs_total - self.graphs_after_first_step


@dataclass
class Mutation:
    """Ways to break a run on purpose, for the tests that prove the checks bite.

    Real scenarios never set these; tests/test_suite_mutations.py does.
    """

    block_plan_overrides: dict[str, Any] | None = None
    float8_filter: Callable[[nn.Module, str], bool] | None = None
    after_parallelize: Callable[[nn.Module], None] | None = None
    fsdp_reshard: bool = True
    dynamo_config: dict[str, Any] | None = None
    skip_checkpoint_load: bool = False
    fsdp_reduce_dtype: torch.dtype | None = None
    """FSDP2 reduces gradients in this dtype, whatever the MixedPrecisionPolicy says."""
    clip_local_norm: bool = False
    """Clipping measures each rank's local shards' norm, never reduced over the ranks."""
    pp_sum_microbatches: bool = False
    """The pipeline schedule sums its microbatches' gradients instead of averaging them."""
    ep_default_divide: bool = False
    """ep_fsdp's experts keep FSDP2's default divide factor (their efsdp size), not the dp size."""
    ddp_hook: Callable | None = None
    """A ddp row registers this communication hook instead of its own."""
    export_local_shards: bool = False
    """The exported state dict holds each rank's local shards as if they were the full tensors."""
    optimizer_impl: str | None = None
    """The parallel run's optimizer steps with this implementation, whatever `opt_impl` says."""
    meta_load_keeps_buffers: bool = False
    """An init=meta_load row leaves its non-persistent buffers (the rotary cache) as to_empty
    left them (here: zeros), as a loader that restores only the state dict does."""
    grad_scaler: Callable[..., Any] | None = None
    """A loss-scaled row's parallel run takes its GradScaler from this factory (keyword
    arguments: step.grad_scaler's), not torch.amp.GradScaler."""
    prefetch_ignored: bool = False
    """A prefetch=explicit row's blocks are sharded without their prefetch lists (FSDP2's implicit order)."""
    sync_every_microbatch: bool = False
    """A grad_sync=last row's FSDP2 still reduces every microbatch's gradients (never told not to);
    a ddp / replicate one all-reduces in every microbatch (no no_sync)."""


def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def full_grads(model: nn.Module, ep: par.ExpertParallel | None = None) -> dict[str, torch.Tensor | None]:
    """Every parameter's gradient as a full float32 CPU tensor (collective for DTensors;
    under expert parallel, each expert's gradient comes from the rank that owns it)."""
    out: dict[str, torch.Tensor | None] = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[clean_name(name)] = None if g is None else g.detach().float().cpu().clone()
    if ep is not None:
        _gather_expert_grads(model, ep, out)
    return out


def _gather_expert_grads(model: nn.Module, ep: par.ExpertParallel, out: dict) -> None:
    import torch.distributed as dist

    for name, p in model.named_parameters():
        key = clean_name(name)
        if ".experts." not in key:
            continue
        expert = int(key.split(".experts.")[1].split(".")[0])
        owner = expert // ep.local
        g = p.grad.detach().clone() if ep.owns(expert) and p.grad is not None else torch.zeros_like(p)
        dist.broadcast(g, src=dist.get_global_rank(ep.group, owner) if ep.group is not None else owner, group=ep.group)
        out[key] = g.float().cpu()


def placement_name(placement: Any) -> str:
    """S<dim>, R or P: a spelling that does not change with torch's placement reprs."""
    if placement.is_shard() or type(placement).__name__ == "_StridedShard":  # FSDP2 over TP: strided
        return f"S{placement.dim}"
    if placement.is_replicate():
        return "R"
    return "P"


def placements(model: nn.Module) -> dict[str, str]:
    """Each parameter's DTensor placements (`local` for a plain tensor)."""
    out = {}
    for name, p in model.named_parameters():
        pl = getattr(p, "placements", None)
        out[clean_name(name)] = "local" if pl is None else ",".join(placement_name(x) for x in pl)
    return out


def gathered(table: dict) -> dict:
    """Every rank's entries in one dict (a pp rank holds its stages' parameters only)."""
    import torch.distributed as dist

    tables: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(tables, table)
    out: dict = {}
    for t in tables:
        out.update({k: v for k, v in t.items() if v is not None or k not in out})
    return dict(sorted(out.items()))


def count_graph_breaks() -> int:
    """Graph breaks Dynamo has counted in this process so far (a run reads the difference)."""
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


_PROFILER_DTYPES = {"float": "float32", "c10::BFloat16": "bfloat16", "c10::Half": "float16", "double": "float64"}


@contextlib.contextmanager
def count_executed_ops(into: Counter, all_reduces: Counter | None = None):
    """Counts the ops a block of code executes, by the profiler's names (aten::mm ...).

    Ops called inside tensor-subclass dispatch (DTensor, Float8) and the extern kernels
    of compiled graphs are recorded too, which a TorchDispatchMode would not see.
    `all_reduces`: also count, by dtype, the process group backend's all-reduces of
    non-scalar floating-point tensors (`gloo:all_reduce`, `nccl:all_reduce`: gradient
    buckets, not a loss being averaged nor DDP's integer bitmap of unused parameters), by
    input dtype (the profiler records shapes then).
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=all_reduces is not None) as prof:
        yield
    counted = _event_names(prof)
    into.update(counted if counted is not None else Counter(event.name for event in prof.events()))
    if all_reduces is not None:
        for event in prof.profiler.kineto_results.events():
            if event.name().endswith(":all_reduce"):
                shapes, dtypes = event.shapes(), event.dtypes()
                dtype = _PROFILER_DTYPES.get(dtypes[0]) if dtypes else None
                if shapes and shapes[0] and dtype:  # not a 0-dim loss, nor find_unused_parameters' int bitmap
                    all_reduces[dtype] += 1


class _Node:
    __slots__ = ("name", "parent", "children")

    def __init__(self, name: str) -> None:
        self.name, self.parent, self.children = name, None, []


def _event_names(prof) -> Counter | None:
    """The names `prof.events()` lists, counted from the profiler's raw events, or None where
    this torch lacks what it reads (the caller then asks `prof.events()`).

    Why: `prof.events()` builds a FunctionEvent per event (some 40 accessor calls each, stacks,
    memory records) and their tree; in a small scenario's last step that was 12-55% of
    run_parallel's CPU on a rank (0.07-0.52 CPU-s a run, tp-eager, fsdp-eager,
    tp-eager-f8_rowwise), and the configurations generator's forks spent a third of their samples
    there. This reads five fields an event and applies torch's own rules (torch 2.13
    autograd/profiler.py `_parse_kineto_results`, profiler_util.py `EventList._build_tree`):
    the utility names `_filter_name` drops and hidden events are left out (a profile holding
    memory records, or an accelerator's runtime launches, is left to `prof.events()`); a synchronous CPU event's parent is the
    innermost one of its thread that encloses it (sorted by start, then longest first); an
    event that is the only child of a parent of the same name is folded into it, until none
    is (`_remove_dup_nodes`: a DTensor op over its lone local op of the same name counts
    once). tests/test_collective_recorder.py holds it equal to `prof.events()`."""
    try:
        from torch.autograd import DeviceType
        from torch.autograd.profiler_util import (MEMORY_EVENT_NAME, OUT_OF_MEMORY_EVENT_NAME, _filter_name,
                                                  _rewrite_name)

        raw_events = prof.profiler.kineto_results.events()
    except Exception:  # noqa: BLE001 - any torch whose profiler differs is asked the slow way
        return None
    try:
        return _fold(raw_events, DeviceType.CPU, (MEMORY_EVENT_NAME, OUT_OF_MEMORY_EVENT_NAME), _filter_name,
                     _rewrite_name)
    except Exception:  # noqa: BLE001 - an event API this torch lacks: the slow way, never a wrong count
        return None


def _fold(raw_events, cpu, memory_names, _filter_name, _rewrite_name) -> Counter | None:
    """`_event_names`' work on the raw events (None: leave them to `prof.events()`)."""
    rows: list[list] = []  # [start_ns, -end_ns, thread, node]
    sync: list[list] = []
    for event in raw_events:
        raw = event.name()
        if raw in memory_names:
            return None  # torch lists the ones no op encloses as events of their own: not emulated
        if _filter_name(raw) or getattr(event, "is_hidden_event", lambda: False)():
            continue
        thread = event.start_thread_id()
        row = [event.start_ns(), -event.end_ns(), thread, _Node(_rewrite_name(name=raw, with_wildcard=True))]
        rows.append(row)
        if event.device_type() != cpu or event.linked_correlation_id() > 0:
            # A device's event or a device runtime's launch (a CUDA / NPU run): torch moves the
            # launch to its op's thread; that was held equal to prof.events() on CPU runs only,
            # so an accelerator's profile is left to prof.events().
            return None
        if not event.is_async() and thread == event.end_thread_id():
            sync.append(row)
    by_thread: dict[int, list[list]] = {}
    for row in sync:
        by_thread.setdefault(row[2], []).append(row)
    for thread_rows in by_thread.values():
        thread_rows.sort(key=lambda r: (r[0], r[1]))
        open_rows: list[list] = []
        for row in thread_rows:
            while open_rows:
                parent = open_rows[-1]
                if row[0] >= -parent[1] or -row[1] > -parent[1]:
                    open_rows.pop()
                else:
                    parent[3].children.append(row[3])
                    row[3].parent = parent[3]
                    break
            open_rows.append(row)
    rows.sort(key=lambda r: (r[0], r[1]))
    nodes = [row[3] for row in rows]
    while True:
        folded = set()
        for node in nodes:
            parent = node.parent
            if parent is not None and parent.name == node.name and len(parent.children) == 1:
                parent.children = node.children
                for child in node.children:
                    child.parent = parent
                folded.add(id(node))
        if not folded:
            return Counter(node.name for node in nodes)
        nodes = [node for node in nodes if id(node) not in folded]


POST_GRAD = "distci_post_grad"
"""The prefix of the post-grad pass's entries in inductor's counters (`<prefix>_graphs`,
`<prefix>:<op>`): inductor stores a compiled graph's counter increments with it in the FX
graph cache and adds them again on a hit, so counts kept there survive a cache hit."""


def _count_post_grad_ops(graph: torch.fx.Graph) -> None:
    """The post-grad pass: which ops a compiled graph holds, into inductor's counters. It runs
    after inductor's own post-grad passes (micro-pipeline TP included), so a fused
    symmetric-memory op counted here is one inductor really emitted."""
    from torch._dynamo.utils import counters

    counts = counters["inductor"]
    counts[f"{POST_GRAD}_graphs"] += 1
    for node in graph.nodes:
        if node.op == "call_function":
            counts[f"{POST_GRAD}:{par.op_name(node.target)}"] += 1


@functools.lru_cache(maxsize=None)
def cached_post_grad_pass() -> Any:
    """The counting pass as a CustomGraphPass whose uuid (the hash of its code) enters inductor's
    cache key, where this torch replays a cached graph's counter increments on a hit (its
    CompiledFxGraph keeps `counter_deltas`); None where it does not: the counts would be lost
    on a hit, so the caches must be off."""
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:
        return None
    graph_types = []
    for module in ("torch._inductor.output_code", "torch._inductor.codecache"):
        try:
            graph_types.append(getattr(importlib.import_module(module), "CompiledFxGraph"))
        except (ImportError, AttributeError):
            continue
    if not any("counter_deltas" in getattr(t, "__annotations__", {}) for t in graph_types):
        return None
    code = inspect.getsource(_count_post_grad_ops) + inspect.getsource(par.op_name) + POST_GRAD

    class PostGradOpCount(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            _count_post_grad_ops(graph)

        def uuid(self) -> str:
            return hashlib.sha256(code.encode()).hexdigest()

    return PostGradOpCount()


@contextlib.contextmanager
def inductor_probe(evidence: Evidence):
    """Records the post-grad ops of every graph inductor compiles inside the block, compiled
    or taken from inductor's caches (see cached_post_grad_pass). Where a cache hit would
    lose them, the FX graph and AOTAutograd caches are off inside the block, so the pass
    sees every graph: the fused async-TP ops must never look absent."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    counting = cached_post_grad_pass()
    patch: dict[str, Any] = {"post_grad_custom_post_pass": counting or _count_post_grad_ops}
    if counting is None:
        patch["fx_graph_cache"] = False
    before = Counter(counters["inductor"])
    with contextlib.ExitStack() as stack:
        stack.enter_context(inductor_config.patch({k: v for k, v in patch.items() if hasattr(inductor_config, k)}))
        try:
            import torch._functorch.config as functorch_config
        except ImportError:
            functorch_config = None
        if counting is None and functorch_config is not None and hasattr(functorch_config, "enable_autograd_cache"):
            stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
        try:
            yield
        finally:
            counted = Counter(counters["inductor"])
            counted.subtract(before)
            evidence.post_grad_graphs = counted[f"{POST_GRAD}_graphs"]
            evidence.post_grad_ops = Counter({name.split(":", 1)[1]: n for name, n in counted.items()
                                              if name.startswith(f"{POST_GRAD}:") and n > 0})
