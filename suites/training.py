"""One runner for every scenario: train the TP model and its single-process reference.

Both start from the same seed-built weights and see the same batches. The reference is
the unsharded model in eager mode with no AC (with the scenario's Float8 recipe when it
has one: Float8 is judged against Float8, as torchao does). The TP run applies the
scenario (parallelize.py). Each step records the loss and every gradient (DTensor
gradients gathered with full_tensor()), and the TP run also records what the compiler
and the step really did: graphs compiled, graph breaks, recompiles, the post-grad ops
inductor emitted, the ops the last step executed, and the parameters' placements.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import parallelize as par
from .models import ModelArgs, build_model
from .scenarios import BATCH, LR, MODEL, SEED, STEPS, Scenario

_WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


@dataclass
class TrainRecord:
    """Per-step losses and gradients (float32, on CPU, full/unsharded)."""

    losses: list[float] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor | None]] = field(default_factory=list)


@dataclass
class Evidence:
    """What the TP run's compiler and kernels did; judged by checks.check_graph."""

    compiled: bool = False
    graphs_after_first_step: int = 0
    graphs_total: int = 0
    graph_breaks: int = 0
    post_grad_graphs: int = 0
    post_grad_ops: Counter = field(default_factory=Counter)
    runtime_ops: Counter = field(default_factory=Counter)
    float8_linears: int = 0
    placements: dict[str, str] = field(default_factory=dict)

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


def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def batches(args: ModelArgs, steps: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Token ids and labels per step, from a private generator (identical on every rank)."""
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, args.vocab_size, (BATCH, args.max_seq_len), generator=gen)
        labels = torch.randint(0, args.vocab_size, (BATCH, args.max_seq_len), generator=gen)
        out.append((tokens, labels))
    return out


def make_optimizer(params, optim: str) -> torch.optim.Optimizer:
    """SGD or AdamW with DTensor and plain parameters in separate groups.

    The `tp` plan leaves the norms' weights plain tensors beside DTensor linears; the
    foreach kernels (the default on CUDA) cannot mix the two in one group. Grouping does
    not change the arithmetic, so the single-group reference stays comparable.
    """
    params = list(params)
    groups = [g for g in ([p for p in params if hasattr(p, "placements")],
                          [p for p in params if not hasattr(p, "placements")]) if g]
    param_groups = [{"params": g} for g in groups]
    if optim == "sgd":
        return torch.optim.SGD(param_groups, lr=LR["sgd"])
    return torch.optim.AdamW(param_groups, lr=LR["adamw"], weight_decay=0.01)


def full_grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Every parameter's gradient as a full float32 CPU tensor (collective for DTensors)."""
    out: dict[str, torch.Tensor | None] = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[clean_name(name)] = None if g is None else g.detach().float().cpu().clone()
    return out


def placement_name(placement: Any) -> str:
    """S<dim>, R or P: a spelling that does not change with torch's placement reprs."""
    if placement.is_shard():
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


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def _train(model: nn.Module, params_of: nn.Module, data, device, optim: str,
           on_step: Callable[[int], contextlib.AbstractContextManager] | None = None) -> TrainRecord:
    record = TrainRecord()
    opt = make_optimizer(params_of.parameters(), optim)
    for step, (tokens, labels) in enumerate(data):
        ctx = on_step(step) if on_step else contextlib.nullcontext()
        with ctx:
            opt.zero_grad(set_to_none=True)
            loss = _loss(model(tokens.to(device)), labels.to(device))
            loss.backward()
        record.losses.append(float(loss.detach().float().cpu()))
        record.grads.append(full_grads(params_of))
        opt.step()
    return record


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


@contextlib.contextmanager
def count_executed_ops(into: Counter):
    """Counts the ops a block of code executes, by the profiler's names (aten::mm ...).

    Ops called inside tensor-subclass dispatch (DTensor, Float8) and the extern kernels
    of compiled graphs are recorded too, which a TorchDispatchMode would not see.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield
    for event in prof.events():
        into[event.name] += 1


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def run_reference(scenario: Scenario, device: torch.device, dtype: str) -> TrainRecord:
    """The unsharded model on one process, eager, no AC; Float8 only when the scenario has it."""
    model = build_model(MODEL, SEED).to(device=device, dtype=_dtype(dtype))
    if scenario.float8 != "none":
        par.convert_float8(model, scenario.float8)
    return _train(model, model, batches(MODEL, STEPS, SEED), device, scenario.optim)


def run_parallel(scenario: Scenario, mesh: Any, device: torch.device, dtype: str,
                 mutation: Mutation | None = None) -> tuple[TrainRecord, Evidence]:
    """The scenario's TP run, with the evidence of what compiled and what executed."""
    mutation = mutation or Mutation()
    evidence = Evidence(compiled=scenario.compiled)
    model = build_model(MODEL, SEED).to(device=device, dtype=_dtype(dtype))
    with contextlib.ExitStack() as stack:
        stack.enter_context(_config_for(scenario, evidence))
        if scenario.float8 != "none":
            evidence.float8_linears = par.convert_float8(model, scenario.float8, mutation.float8_filter)
        par.apply_tp(model, mesh, scenario.plan, scenario.float8, mutation.block_plan_overrides)
        if scenario.async_tp:
            par.enable_async_tp(mesh)
        par.apply_ac(model, scenario.ac)
        counter = par.CompileCounter(scenario.backend) if scenario.compiled else None
        runnable = par.apply_compile(model, scenario.compile, counter) if counter else model
        if mutation.after_parallelize:
            mutation.after_parallelize(model)
        evidence.placements = placements(model)
        breaks_before = _graph_breaks()

        def on_step(step: int):
            if step == 1 and counter is not None:
                evidence.graphs_after_first_step = counter.graphs
            if step == STEPS - 1:
                return count_executed_ops(evidence.runtime_ops)
            return contextlib.nullcontext()

        record = _train(runnable, model, batches(MODEL, STEPS, SEED), device, scenario.optim, on_step)
        if counter is not None:
            evidence.graphs_total = counter.graphs
            if STEPS == 1:
                evidence.graphs_after_first_step = counter.graphs
        evidence.graph_breaks = _graph_breaks() - breaks_before
    return record, evidence


@contextlib.contextmanager
def _config_for(scenario: Scenario, evidence: Evidence):
    """The scenario's compiler settings (async TP, rowwise casts) plus the inductor probe."""
    if not scenario.uses_inductor:
        yield
        return
    import torch._inductor.config as inductor_config

    patch: dict[str, Any] = {}
    if scenario.async_tp:
        patch["_micro_pipeline_tp"] = True
    if scenario.float8.startswith("rowwise"):
        patch["emulate_precision_casts"] = True  # as torchtitan sets for rowwise Float8
    patch = {k: v for k, v in patch.items() if hasattr(inductor_config, k)}
    with inductor_config.patch(patch), inductor_probe(evidence):
        yield


@contextlib.contextmanager
def inductor_probe(evidence: Evidence):
    """Records the post-grad ops of every graph inductor compiles inside the block.

    Inductor's caches are turned off so the pass sees every graph: a cache hit skips the
    passes, and the fused async-TP ops would look absent.
    """
    import torch._inductor.config as inductor_config

    counter = par.PostGradOpCounter()
    patch = {"post_grad_custom_post_pass": counter, "fx_graph_cache": False}
    with contextlib.ExitStack() as stack:
        stack.enter_context(inductor_config.patch({k: v for k, v in patch.items() if hasattr(inductor_config, k)}))
        try:
            import torch._functorch.config as functorch_config
        except ImportError:
            functorch_config = None
        if functorch_config is not None and hasattr(functorch_config, "enable_autograd_cache"):
            stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
        try:
            yield
        finally:
            evidence.post_grad_graphs = counter.graphs
            evidence.post_grad_ops = counter.ops
