"""Bugs planted on purpose in the DTensor side of an op case, for the tests that prove the ops
generator finds and shrinks them (tests/test_fuzz_ops.py). A real run never sets
DISTCI_OPS_PLANT.

Each is written the way such bugs sit in DTensor's sharding rules: right for most sizes,
placements and ops, wrong in one corner, and quiet (nothing raises):
  - shard_shape: `cat`'s rule computes the local shape of a result sharded on a dim of
    global size 7 one row short on the last shard (a ceil/floor slip only an odd size hits);
  - avg_twice: `sum` / `mean` of a Partial(avg) input divide by the mesh axis size twice;
  - grad_drop: the backward of `rms_norm` drops the input's gradient when the input is
    sharded on its last (the normalized) dim.
  - spin: `sigmoid` loops forever in pure Python on every rank before any collective (as
    DTensor's view_groups does for `dtensor-view-zero-dim-loops`), `gelu` on mesh coordinate 0
    only, while the other ranks go on into the judge's collectives and wait there (what the
    case's time bound must turn into a failure: suites/generators/case_bound.py); `softmax`
    first pushes a dispatch mode that breaks every later `silu` and never pops it (what a bound
    that hits inside a mode's __exit__ can leave: the sweep must not run its next case there);
    `clamp` deadlocks every rank in C before any Python can cut it (each waits for a message its
    peer never sends), as a case whose
    ranks take different collectives does (reports/fuzz-ops.md: index_add's placements by
    rank): no rank finishes, none uses CPU, only the ranks' pulses can end it before the
    watchdog (suites/generators/ops_sweep.Pulse).
  - unread_ones: the backward of `split` / `chunk` / `unbind` takes an output the loss never
    read as a gradient of ones instead of zeros (an undefined gradient materialized wrong): only
    the `use=first` form (distci/op_inventory.py USE) has such an output.
  - mask_redrawn: the backward of a dropout whose input is sharded masks the gradient with a
    mask of its own (where the incoming gradient is positive) instead of the forward's: what the
    random judge's "the mask the same in its backward" must see (suites/generators/ops_random.py).
  - replica_drift: a random op whose output is Replicate hands odd ranks their draws in another
    order (as a rank that drew from its own stream would): the random judge's replica check.
None is shaped like a column of the scenario table: each needs an op, a placement and
(shard_shape) a size together, which is what the shrinker must keep and nothing more.
"""

from __future__ import annotations

import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PLANT_ENV = "DISTCI_OPS_PLANT"


class _Plant:
    def inputs(self, case, dts: list) -> list:
        return dts

    def outputs(self, case, outs: tuple, mesh) -> tuple:
        return outs


def _with_local(o, local, mesh):
    """`o` (a DTensor) holding `local` on this rank, its placements and global shape kept."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, mesh, o.placements, run_check=False, shape=o.shape, stride=o.stride())


class ShardShape(_Plant):
    def outputs(self, case, outs, mesh):
        if case.op != "cat":
            return outs
        fixed = []
        for o in outs:
            shard = next((a for a, p in enumerate(o.placements) if p.is_shard() and o.shape[p.dim] == 7), None)
            if shard is not None and mesh.get_local_rank(shard) == mesh.size(shard) - 1:
                d = o.placements[shard].dim
                o = _with_local(o, o.to_local().narrow(d, 0, max(0, o.to_local().shape[d] - 1)), mesh)
            fixed.append(o)
        return tuple(fixed)


class AvgTwice(_Plant):
    def outputs(self, case, outs, mesh):
        if case.op not in ("sum", "mean"):
            return outs
        axes = [a for a, p in enumerate(case.placements[0]) if p == "Pavg"]
        if not axes:
            return outs
        o = outs[0]
        n = 1
        for a in axes:
            n *= mesh.size(a)
        return (_with_local(o, o.to_local() / n, mesh),)


class _BackwardAs(torch.autograd.Function):
    """Identity forward; the backward hands on `change(grad)` (a planted wrong gradient)."""

    @staticmethod
    def forward(ctx, x, change):
        ctx.change = change
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.change(grad), None


class GradDrop(_Plant):
    def inputs(self, case, dts):
        last = len(case.shapes[0]) - 1
        sharded_last = any(p in (f"S{last}", "S-1") for p in case.placements[0])
        if case.op != "rms_norm" or not sharded_last:
            return dts
        return [_BackwardAs.apply(dts[0], lambda g: g * 0), *dts[1:]]


def _step(n: int) -> int:
    return (n * 7 + 1) % 1_000_003


def _spin_forever() -> None:
    """A loop that never ends and calls a helper, as view_groups calls guard_or_false: the
    bound must name this function, not the helper it happens to be in."""
    n = 0
    while n >= 0:
        n = _step(n)


class PythonSpin(_Plant):
    def inputs(self, case, dts):
        import torch.distributed as tdist

        if case.op == "softmax":
            from torch.utils._python_dispatch import _push_mode

            _push_mode(_BreaksSilu())
        if case.op in ("sigmoid", "softmax") or (case.op == "gelu" and tdist.get_rank() == 0):
            _spin_forever()
        if case.op == "clamp":  # every rank receives from the next, none sends
            tdist.recv(torch.zeros(1), src=(tdist.get_rank() + 1) % tdist.get_world_size())
        return dts


class _BreaksSilu(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.silu.default:
            raise RuntimeError("planted: a dispatch mode the case before left on")
        return func(*args, **(kwargs or {}))


class _UnreadAsOnes(torch.autograd.Function):
    """Identity over an op's outputs whose backward gives an output nobody read ones."""

    @staticmethod
    def forward(ctx, *outs):
        ctx.set_materialize_grads(False)
        ctx.likes = [torch.ones_like(o) for o in outs]
        return tuple(o.view_as(o) for o in outs)

    @staticmethod
    def backward(ctx, *grads):
        return tuple(like if g is None else g for g, like in zip(grads, ctx.likes))


class UnreadOnes(_Plant):
    def outputs(self, case, outs, mesh):
        if case.op not in ("split", "chunk", "unbind") or len(outs) < 2 or not outs[0].requires_grad:
            return outs
        return tuple(_UnreadAsOnes.apply(*outs))


class MaskRedrawn(_Plant):
    def outputs(self, case, outs, mesh):
        if case.op != "dropout_train" or not any(p.startswith("S") for p in case.placements[0]):
            return outs
        return (_BackwardAs.apply(outs[0], lambda g: g * (g > 0).to(g.dtype)),)


class ReplicaDrift(_Plant):
    def outputs(self, case, outs, mesh):
        import torch.distributed as tdist

        o = outs[0]
        if not case.op.startswith(("rand_like", "init_")) or not all(p.is_replicate() for p in o.placements):
            return outs
        return (_with_local(o, o.to_local().flip(-1) if tdist.get_rank() % 2 and o.ndim else o.to_local(), mesh),)


class LossParallelIgnoreMean(_Plant):
    def __init__(self) -> None:
        self.fraction = 1.0

    def inputs(self, case, dts):
        self.fraction = 1.0
        if case.op == "lp_cross_entropy" and case.param.get("reduction") == "mean":
            target = dts[1].full_tensor()
            if target.numel():
                self.fraction = float((target != -100).sum()) / target.numel()
        return dts

    def outputs(self, case, outs, mesh):
        if self.fraction in (0.0, 1.0):
            return outs
        return (_with_local(outs[0], outs[0].to_local() * self.fraction, mesh),)


PLANTS = {"shard_shape": ShardShape, "avg_twice": AvgTwice, "grad_drop": GradDrop, "spin": PythonSpin,
          "unread_ones": UnreadOnes, "mask_redrawn": MaskRedrawn, "replica_drift": ReplicaDrift,
          "lp_ignore_mean": LossParallelIgnoreMean}


def planted(name: str | None = None) -> _Plant | None:
    """The plant named by `name` (default: $DISTCI_OPS_PLANT), or None."""
    name = os.environ.get(PLANT_ENV, "") if name is None else name
    if not name:
        return None
    if name not in PLANTS:
        raise ValueError(f"{PLANT_ENV}={name!r} is not a plant; plants: {', '.join(PLANTS)}")
    return PLANTS[name]()
