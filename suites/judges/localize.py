"""Localization: the first module where a parallel run leaves its reference, so a find
arrives triaged ("the gradient into layers.0.ffn.experts.1 differs first", not "step 2's
loss is off").

TTrace's idea (localizing silent bugs of Megatron-LM to the first diverging tensor): trace
every module's forward output and the gradient flowing into it, in execution order, on
both sides; the first traced tensor outside a bound derived from the dtype's rounding is
where the bug sits. The bound is per element, from eps and magnitude:
|run - ref| <= ROUNDINGS * eps(dtype) * (|ref| + mean|ref|) (the mean term: an element near
zero carries the rounding of its neighbours' sums). A parallel run reorders sums (TP's
all-reduce, sharded matmuls), which moves results by a few roundings; a bug moves them by
far more. Parameter gradients are compared last, per parameter, by the same bound: a bug
in the gradient bookkeeping (a dropped contribution, a stale one) shows there with every
activation still equal.

Tracing records local tensors only (no collective inside a hook: ranks whose autograd
graphs differ, an expert idle on one rank, would deadlock); a parallel run gathers each
microbatch's trace once (`gather_trace`), and `combine` rebuilds the full tensor: data-
parallel shards concatenated along the batch, TP shards along the dim whose size differs.

A compiled module is traced from outside its compiled frame only (`Tracer.traced`): a hook
inside would be traced by Dynamo, which fullgraph=True refuses and which otherwise breaks the
graph being tested. The comparison takes only what both sides traced, so against an eager
reference a divergence inside a compiled block is named at the block.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn as nn

from ..runner.evidence import clean_name

ROUNDINGS = 128
"""Roundings a correct parallel run may be off by, per element (measured: TP and FSDP2 over
these small models stay within 8 in float32)."""

Key = tuple[str, str, int]
"""(kind, module, occurrence): `forward output` / `output gradient`, the module's name, and
which call of it (a reused block runs twice)."""


@dataclass(frozen=True)
class Divergence:
    step: int
    microbatch: int
    kind: str
    module: str
    error: float
    bound: float

    def __str__(self) -> str:
        where = f"step {self.step}" + (f", microbatch {self.microbatch}" if self.microbatch >= 0 else "")
        return (f"first divergence: the {self.kind} of {self.module} ({where}; max |diff| {self.error:.3g}, "
                f"{self.error / self.bound:.3g}x the rounding bound)")

    @property
    def signature(self) -> str:
        """What tells bugs apart: where and what, module indices as N (a shrunk model renumbers)."""
        return f"the {self.kind} of {re.sub(r'(?<=[.])[0-9]+(?=[.]|$)', 'N', self.module)} leaves the reference first"


@dataclass
class Trace:
    """One side's tensors, per (step, microbatch), in execution order."""

    events: dict[tuple[int, int], list[tuple[Key, torch.Tensor]]] = field(default_factory=dict)


class Tracer:
    """Forward hooks on every submodule: the output, and a hook on it for its gradient."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.current: list[tuple[Key, torch.Tensor]] = []
        self.calls: dict[tuple[str, str], int] = {}

    def _record(self, kind: str, name: str, t: torch.Tensor) -> None:
        n = self.calls.get((kind, name), 0)
        self.calls[(kind, name)] = n + 1
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        self.current.append(((kind, name, n), t.detach().float().cpu().clone()))

    def _hook(self, name: str):
        def hook(module, args, output) -> None:
            out = output[0] if isinstance(output, (tuple, list)) else output
            if not isinstance(out, torch.Tensor):
                return
            self._record("forward output", name, out)
            if out.requires_grad:  # an undefined gradient (None) is a zero one: recorded, compared
                shape = out.shape
                out.register_hook(lambda g: self._record("output gradient", name,
                                                         torch.zeros(shape) if g is None else g))
        return hook

    def traced(self) -> Iterator[tuple[str, nn.Module]]:
        """The modules whose forward runs outside any compiled frame: a hook inside one would be
        traced by Dynamo (fullgraph refuses it, else it breaks the graph the trainer compiles).
        A compiled block's wrapper (torch.compile's OptimizedModule) is traced, its `_orig_mod`
        not; a model compiled whole (suites/generators/model_compile.py) has none."""
        if getattr(self.model, "_distci_compiled_whole", False):
            return
        for n, m in self.model.named_modules():
            if n and "_orig_mod" not in n.split("."):
                yield n, m

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        handles = [m.register_forward_hook(self._hook(clean_name(n))) for n, m in self.traced()]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def take(self) -> list[tuple[Key, torch.Tensor]]:
        """This microbatch's events (and a fresh start for the next)."""
        out, self.current, self.calls = self.current, [], {}
        return out


def gather_trace(events: list[tuple[Key, torch.Tensor]], group=None) -> list[list[tuple[Key, torch.Tensor]]]:
    """Every rank's events of one microbatch (one collective, outside any hook)."""
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, events, group=group)
    return parts


def combine(parts: list[torch.Tensor], like: torch.Tensor, data_parallel: bool) -> torch.Tensor | None:
    """The full tensor from the ranks' parts (None: no way to rebuild `like`'s shape)."""
    if not parts:
        return None
    if data_parallel:
        full = torch.cat(parts, 0) if parts[0].dim() else parts[0]
        return full if full.shape == like.shape else None
    if parts[0].shape == like.shape:
        return parts[0]
    for d in range(like.dim()):
        if all(p.dim() == like.dim() for p in parts) and sum(p.shape[d] for p in parts) == like.shape[d]:
            full = torch.cat(parts, d)
            if full.shape == like.shape:
                return full
    return None


def excess(run: torch.Tensor, ref: torch.Tensor, eps: float) -> tuple[float, float]:
    """(max |run - ref|, the bound at that element); diverged where the first exceeds the second."""
    diff = (run.double() - ref.double()).abs()
    bound = ROUNDINGS * eps * (ref.double().abs() + ref.double().abs().mean())
    ratio = diff / bound.clamp_min(torch.finfo(torch.float64).tiny)
    i = int(ratio.flatten().argmax())
    return float(diff.flatten()[i]), float(bound.flatten()[i])


def first_divergence(ref: Trace, run_parts: dict[tuple[int, int], list[list[tuple[Key, torch.Tensor]]]],
                     data_parallel: bool, world_size: int, dtype: torch.dtype = torch.float32,
                     ref_grads: list | None = None, run_grads: list | None = None) -> Divergence | None:
    """The first traced tensor (in the reference's execution order, step by step) outside
    its rounding bound; then, per step, the first parameter gradient. None: nothing diverged
    (or the bug is outside what the trace sees)."""
    eps = torch.finfo(dtype).eps
    steps = sorted({s for s, _ in ref.events})
    for step in steps:
        for (s, micro) in sorted(k for k in ref.events if k[0] == step):
            by_key: dict[Key, list[torch.Tensor]] = {}
            for rank_events in run_parts.get((s, micro), []):
                for k, t in rank_events:
                    by_key.setdefault(k, []).append(t)
            for k, r in ref.events[(s, micro)]:
                parts = by_key.get(k, [])
                if k[0] == "output gradient" and data_parallel:
                    parts = [p / world_size for p in parts]  # each rank's loss is its rows' mean
                full = combine(parts, r, data_parallel)
                if full is None:
                    continue  # not rebuilt here (an expert no rank's token reached has no trace)
                err, bound = excess(full, r, eps)
                if err > bound:
                    return Divergence(step, micro, k[0], k[1], err, bound)
        if ref_grads is not None and run_grads is not None and step < len(ref_grads) and step < len(run_grads):
            for name in ref_grads[step]:
                r, g = ref_grads[step][name], run_grads[step].get(name)
                if (r is None) != (g is None):
                    return Divergence(step, -1, "gradient (present on one side only)", name, float("inf"), 1.0)
                if r is not None and g is not None and g.shape == r.shape:
                    err, bound = excess(g, r, eps)
                    if err > bound:
                        return Divergence(step, -1, "parameter gradient", name, err, bound)
    return None
