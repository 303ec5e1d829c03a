"""Runs one op case on the rank pool and judges it against the same op on the full tensors.

Every rank builds the full inputs from the case's seed, distributes them with the case's
placements, runs the op (suites/generators/op_calls.py) on the DTensors and on the full
tensors, backpropagates the same seeded cotangent through both, and compares:
  1. an exception on the DTensor side where the full op ran is a failure, unless it is a
     "no sharding strategy registered" NotImplementedError or DTensor's explicit "Please
     redistribute" refusal of the op's own call: a capability gap (counted);
  2. each output: a DTensor, legal placements, the local shape its placements say, the
     full shape and dtype, and its value within the dtype's rounding (suites/tolerances);
  3. each input's gradient: present where the reference has one, and its value.
The first of these that fails localizes the case: the problem names the op, mesh,
placements, sizes and the first output or gradient that differs and by how much against
the threshold. Its `signature` (op and what differs, numbers out) is what the shrinker
keeps. A case whose full-tensor op raises is `invalid` (the draw asked for something the
op does not take: a 0-sized head dim, k > size), not a find. The checks both judges use live in
suites/generators/ops_checks.py; random ops are judged in suites/generators/ops_random.py.
"""

from __future__ import annotations

import contextlib

import torch

from distci.op_case import DTYPES, MESHES, OpCase, meaningless
from distci.op_inventory import spec_of

from .op_calls import CALLS, Context
from .ops_checks import (_check_output, _compare, _everywhere, _gathered, _local_problem, _loss, _raised, _where,
                         backward)
from .ops_outcome import CaseOutcome, RaisedAnywhere, leave_if_raised
from .ops_random import judge_random


def placement(text: str, mesh, axis: int):
    from torch.distributed.tensor import Partial, Replicate, Shard

    if text == "R":
        return Replicate()
    if text in ("Psum", "Pavg"):
        return Partial(text[1:])
    if text.startswith("SS"):
        from torch.distributed.tensor.placement_types import _StridedShard

        return _StridedShard(int(text[2:]), split_factor=mesh.size(axis + 1))
    return Shard(int(text[1:]))


def mesh_for(case: OpCase, dist):
    """The case's mesh over this pool: the whole world, or a 1-D mesh of 2 as the tp
    submesh of the 2x2 mesh (every rank takes part, as in a trainer's submesh)."""
    shape, names = MESHES[case.mesh]
    size = case.world_size
    if size == dist.world_size:
        return dist.mesh(shape, names)
    if case.mesh == "2" and dist.world_size == 4:
        return dist.mesh(*MESHES["2x2"])["tp"]
    raise ValueError(f"case {case.id}: mesh {case.mesh} does not fit a world of {dist.world_size}")


def full_inputs(case: OpCase, device) -> list[torch.Tensor]:
    spec, dtype = spec_of(case.op), getattr(torch, DTYPES[case.dtype])
    out = []
    for i, (arg, shape) in enumerate(zip(spec.args, case.shapes)):
        g = torch.Generator().manual_seed(case.seed * 1009 + i)
        kind, _, var = arg.kind.partition(":")
        if kind == "perm":
            n = 1
            for d in shape:
                n *= d
            high = dict(case.extra.get("sizes") or {}).get(var) or _size_of(case, var)
            t = torch.randperm(max(high, n), generator=g)[:n].reshape(shape)
        elif kind in ("index", "target"):
            high = max(1, dict(case.extra.get("sizes") or {}).get(var) or _size_of(case, var))
            t = torch.randint(0, high, shape, generator=g)
            if kind == "target":
                t = torch.where(torch.rand(shape, generator=g) < 0.2, torch.full_like(t, -100), t)
        elif kind == "mask":
            t = torch.rand(shape, generator=g) < 0.5
        elif kind == "distinct":
            n = 1
            for s in shape:
                n *= s
            t = (torch.randperm(n, generator=g).float() / max(n, 1)).reshape(shape).to(dtype)
        else:
            t = torch.randn(shape, generator=g)
            t = (t.abs() + 0.5 if kind == "pos" else t).to(dtype)
        out.append(t.to(device))
    return out


def _size_of(case: OpCase, var: str) -> int:
    """A size variable read back from the shapes (a case from an id alone): the op's
    templates name where it sits."""
    spec = spec_of(case.op)
    for arg, shape in zip(spec.args, case.shapes):
        tokens = [t for t in arg.dims.split() if not t.endswith("?")]
        optional = [t for t in arg.dims.split() if t.endswith("?")]
        if var in tokens and len(shape) in (len(tokens), len(tokens) + len(optional)):
            return shape[len(shape) - len(tokens) + tokens.index(var)]
    return 1


def distribute(full: torch.Tensor, mesh, places: tuple[str, ...], share: int = 0):
    """`full` laid out with `places`; a Partial axis holds unequal shares that sum (or
    average) to the full value, as partial results of a sharded reduction do."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    objs = [placement(p, mesh, a) for a, p in enumerate(places)]
    if places[0].startswith("SS"):
        return _fsdp_over_tp(full, mesh, objs)
    if not any(p.startswith("P") for p in places):
        return distribute_tensor(full, mesh, objs)
    base = distribute_tensor(full, mesh, [Replicate() if p.startswith("P") else o for p, o in zip(places, objs)])
    local = base.to_local()
    for a, p in enumerate(places):
        if p.startswith("P"):
            n, c = mesh.size(a), mesh.get_local_rank(a)
            weight = _share_weight(c, n)
            local = local * (weight / n if p == "Psum" else weight)
    return DTensor.from_local(local, mesh, objs, run_check=False, shape=full.shape, stride=full.stride())


def _share_weight(coordinate: int, n: int) -> float:
    """How many n-ths of a Partial input coordinate `coordinate` of `n` holds (unequal on purpose)."""
    return 1.0 + (coordinate - (n - 1) / 2) / n


def share_fractions(places: tuple[str, ...], mesh) -> list[float]:
    """The fraction of the full value each rank's share of a Partial input holds (one per mesh
    coordinate of its Partial axes, summing to 1): `distribute`'s split, as a number."""
    fractions = [1.0]
    for a, p in enumerate(places):
        if p.startswith("P"):
            n = mesh.size(a)
            fractions = [f * _share_weight(c, n) / n for f in fractions for c in range(n)]
    return fractions


def _fsdp_over_tp(full: torch.Tensor, mesh, objs):
    """(_StridedShard(d), Shard(d)) on (dp, tp) built as FSDP2 builds it over a TP parameter
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: the tp-local tensor chunked on the
    dp axis, torch.chunk's uneven chunks, an empty one where chunk runs out, wrapped with
    from_local): `distribute_tensor` asserts on this layout when the mesh does not divide
    the dim (the night runs' c2), while FSDP2 over TP produces it for any size."""
    from torch.distributed.tensor import DTensor

    dim = objs[1].dim % full.ndim
    local = full
    for axis in (1, 0):  # tp first, then dp over tp's local shard
        n, c = mesh.size(axis), mesh.get_local_rank(axis)
        chunks = torch.chunk(local, n, dim=dim) if local.shape[dim] else ()
        local = chunks[c] if c < len(chunks) else local.narrow(dim, 0, 0)
    return DTensor.from_local(local.contiguous(), mesh, objs, run_check=False, shape=full.shape,
                              stride=full.stride())


def run_case(case: OpCase, dist, plant=None, ask: RaisedAnywhere | None = None) -> CaseOutcome:
    """Run and judge one case on this rank (callers agree across ranks: suites/generators/ops_entry.py);
    `ask`: after each phase that can raise on some ranks only, whether any rank raised (all leave)."""
    with op_context(spec_of(case.op).context):
        return _run_case(case, dist, plant, ask)


@contextlib.contextmanager
def op_context(name: str):
    """The context trainers run the op and its backward in (OpSpec.context): loss_parallel() for
    the losses a TP run computes on vocab-sharded logits. The reference runs in it too (its
    handlers only see DTensors). Always left, whatever the case raised or its bound cut:
    loss_parallel's own manager does not undo its handlers when its body raises, and a handler
    left on would change every later case of the sweep."""
    if name != "loss_parallel":
        yield
        return
    from torch.distributed.tensor.parallel import loss_parallel

    manager = loss_parallel()
    manager.__enter__()
    try:
        yield
    finally:
        manager.__exit__(None, None, None)


def _run_case(case: OpCase, dist, plant, ask: RaisedAnywhere | None) -> CaseOutcome:
    import time

    from torch.distributed.tensor import DTensor

    started = time.monotonic()
    if why := meaningless(case):  # a case from an id the RULES forbid (drawn ones never are)
        return CaseOutcome("invalid", None, f"a layout no parallelism builds: {why}", 0.0)
    spec = spec_of(case.op)
    call = CALLS[case.op]
    device = dist.device
    mesh = mesh_for(case, dist)
    params = case.param
    fulls = full_inputs(case, device)
    wants_grad = [spec.grad and arg.grad and t.is_floating_point() for arg, t in zip(spec.args, fulls)]
    terms = max([t.numel() for t in fulls] + [1])
    empty = False

    def done(status: str, signature: str | None = None, message: str = "") -> CaseOutcome:
        return CaseOutcome(status, signature, message, time.monotonic() - started, empty)

    def like_full(t: torch.Tensor, k: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(case.seed * 7919 + 101 * k)
        return torch.randn(t.shape, generator=g).to(t.dtype).to(device)

    def like_dt(t, k: int):
        return distribute(like_full(t, k), t.device_mesh, tuple(_text(p) for p in t.placements))

    # the reference: the op on the full tensors
    refs = [t.clone().requires_grad_(w) for t, w in zip(fulls, wants_grad)]
    try:
        torch.manual_seed(case.seed)  # a random op draws as a trainer's ranks, seeded alike, do
        ref_out = call(refs, params, Context(like_full))
        cotangents = _cotangents(case, ref_out)
        if cotangents:
            _loss(ref_out, cotangents).backward()
    except Exception as exc:  # the op does not take this draw
        return done("invalid", None, f"the full-tensor op raised {type(exc).__name__}: {str(exc)[:300]}")
    # the same op on DTensors
    failed = None
    try:
        dts = [distribute(t, mesh, pl).requires_grad_(w) for t, pl, w in zip(fulls, case.placements, wants_grad)]
    except Exception as exc:
        failed = _raised(case, exc, "distributing the inputs", done)
    if left := leave_if_raised(failed, ask):
        return left
    if any(p.startswith("P") for pl in case.placements for p in pl):
        redone = _reference_on_shares(case, call, params, fulls, dts, wants_grad, terms, like_full)
        if isinstance(redone, str):
            return done("fail", f"{case.op}: " + ": ".join(redone.split(": ")[:2]),
                        f"{case.op}: {redone}\n  case {case.id}\n  {_where(case)}")
        refs, ref_out, cotangents = redone
    empty = any(d.to_local().numel() == 0 < t.numel() for d, t in zip(dts, fulls))
    ins = plant.inputs(case, dts) if plant else dts
    try:
        torch.manual_seed(case.seed)
        out = call(ins, params, Context(like_dt))
        out = plant.outputs(case, out, mesh) if plant else out
    except Exception as exc:
        failed = _raised(case, exc, "the op", done)
    if left := leave_if_raised(failed, ask):
        return left
    if spec.random:  # no single-device value to equal: what DTensor promises, per placement
        return judge_random(case, out, ref_out, dts, cotangents, mesh, done, ask)
    # a local shape can be wrong on one rank only: agree before any collective reads it
    problems = [p for p in [_everywhere(_local_problem(out, ref_out, mesh, DTensor))] if p]
    gathered = []  # each output read once: the loss below reuses it (a second reduction is another op)
    for i, (o, r) in enumerate(zip(out, ref_out)):
        if problems:
            break
        found, full = _check_output(i, o, r, mesh, case, terms, DTensor)
        problems += found
        gathered.append(full)
    if len(out) != len(ref_out):
        problems.append(f"outputs: count: {len(out)}, the full op gives {len(ref_out)}")
    fractions = next((share_fractions(pl, mesh) for pl in case.placements if any(p.startswith("P") for p in pl)), [])
    split: list = []  # the reference's gradients with the cotangent split as the first Partial input's shares
    if not problems and cotangents:
        if left := backward(case, gathered, cotangents, done, ask):
            return left
        for i, (dt, ref) in enumerate(zip(dts, refs)):
            if ref.grad is None:
                continue
            if dt.grad is None:
                problems.append(f"gradient of input {i}: missing: the full op gives one")
            else:
                full, bad = _gathered(f"gradient of input {i}", dt.grad)
                bad = bad or _compare(f"gradient of input {i}", full, ref.grad, case.dtype, terms)
                if bad and full is not None and fractions:  # the single-device op's own answer, split as shares split?
                    split = split or _split_cotangent_grads(call, params, refs, wants_grad, cotangents, fractions,
                                                            like_full)
                    bad = bad if split[i] is None or _compare("", full, split[i], case.dtype, terms) else None
                problems += [bad] if bad else []
            if problems:
                break
    if problems:
        first = problems[0]
        signature = f"{case.op}: " + ": ".join(first.split(": ")[:2])
        return done("fail", signature, f"{signature}\n  {first}\n  case {case.id}\n  {_where(case)}")
    return done("pass")


def _reference_on_shares(case: OpCase, call, params, fulls, dts, wants_grad, terms: int, like_full):
    """The reference again, on the values the Partial inputs really hold.

    A Partial input's shares sum (or average) to the full tensor only up to rounding, so
    the DTensor op runs on a value an ulp away from the reference's. An op that amplifies
    its input's rounding (layer_norm over a dim of one element divides x - mean, all
    rounding, by sqrt(eps): 316x) then differs from the reference with nothing wrong (the
    night run's `layer_norm~2~f32~1x1,1,1~Psum,R,R~-~909`, 2.6x the threshold). So the
    inputs are first checked to round-trip (`full_tensor()` against the drawn tensor: a
    wrong Partial reduction is still a find) and the reference is recomputed on what they
    hold. Returns (refs, outputs, cotangents) or the problem."""
    held = []
    for i, (dt, full) in enumerate(zip(dts, fulls)):
        value, bad = _gathered(f"input {i}", dt)
        bad = bad or _compare(f"input {i} (distributed, read back)", value, full, case.dtype, terms)
        if bad:
            return bad
        held.append(value.detach())
    refs = [t.clone().requires_grad_(w) for t, w in zip(held, wants_grad)]
    ref_out = call(refs, params, Context(like_full))
    cotangents = _cotangents(case, ref_out)
    if cotangents:
        _loss(ref_out, cotangents).backward()
    return refs, ref_out, cotangents


def _split_cotangent_grads(call, params, refs, wants_grad, cotangents, fractions: list[float], like_full) -> list:
    """The reference's gradients again, its backward run once per share of the cotangent
    (`fractions` of it, summing to 1) and summed: the same gradient for every op (a backward
    is linear in its cotangent), rounded as a Partial input's ranks round it.

    An op linear in a Partial input (rms_norm_manual's `weight * h`) keeps the result Partial,
    so each rank backpropagates its share of the cotangent through h on its own and the
    gradients are summed. Where the op's backward cancels (h = x / sqrt(mean(x^2) + eps) over
    one element: two terms of ~1/|x| that cancel to eps-sized ones), the shares round apart
    from the whole cotangent by many ulps of the result (the bench's
    `rms_norm_manual~2~f32~4x4x1,1~R,Psum~-~431`: 4x the f32 threshold, and this split on one
    device gives the DTensor's value to the bit). A gradient that matches this split is the
    single-device op's own answer; a wrong one matches neither (tests/test_fuzz_ops.py)."""
    held = [r.detach() for r in refs]
    grads: list = [None] * len(held)
    for fraction in fractions:
        again = [t.clone().requires_grad_(w) for t, w in zip(held, wants_grad)]
        out = call(again, params, Context(like_full))
        _loss(out, [None if c is None else c * fraction for c in cotangents]).backward()
        grads = [g if a.grad is None else (a.grad if g is None else g + a.grad) for g, a in zip(grads, again)]
    return grads


def _cotangents(case: OpCase, outputs) -> list:
    """A seeded cotangent per differentiable output the loss reads: all of them, or the first
    only under the `use=first` form (distci/op_inventory.py USE; the others get no gradient)."""
    spec = spec_of(case.op)
    if not spec.grad:
        return []
    out = []
    for i, o in enumerate(outputs):
        g = torch.Generator().manual_seed(case.seed * 31 + i)
        ok = o.is_floating_point() and o.requires_grad and (i == 0 or case.param.get("use") != "first")
        out.append(torch.randn(tuple(o.shape), generator=g).to(o.device) if ok else None)
    return out if any(c is not None for c in out) else []


def timed_out(case: OpCase, bound) -> CaseOutcome:
    """The outcome of a case its bound (suites/generators/case_bound.py's Bound) cut: a failure
    whose signature names where it spun, no op in it (one loop of DTensor's is one find across
    ops, as a raised error is). Raised: a rank may have issued a collective its peers never
    did, so a sweep checks its groups are in step before going on."""
    hit = bound.hit
    message = f"{hit.signature}\n  {hit.describe()}\n  case {case.id}\n  {_where(case)}"
    return CaseOutcome("fail", hit.signature, message, bound.elapsed, raised=True)


def _text(p) -> str:
    name = type(p).__name__
    if name == "Replicate":
        return "R"
    if name == "Partial":
        return "P" + p.reduce_op
    if name == "_StridedShard":
        return f"SS{p.dim}"
    return f"S{p.dim}"
