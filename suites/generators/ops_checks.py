"""What the op cases' judges share (suites/generators/ops_cases.py compares with the full-tensor
op, suites/generators/ops_random.py with what DTensor promises of a random op): reading a DTensor
back, comparing a value with the reference within the dtype's rounding, the structure of an
output, the ranks agreeing on a problem, the loss's backward, and which exceptions are gaps
(a missing sharding strategy, DTensor's named refusals) rather than finds.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from distci.op_case import DTYPES, OpCase
from distci.op_inventory import spec_of
from distci.results import error_signature

from ..judges.tolerances import ROUNDING, op_threshold
from .ops_outcome import CaseOutcome, leave_if_raised

GAP = re.compile(r"sharding strateg|does not have a sharding|no sharding|sharding propagation (?:is )?not")
"""A missing sharding strategy: a capability gap, counted per op, never a failure."""
REFUSED = re.compile(r"[Pp]lease\s+redistribute|cannot\s+be\s+evenly\s+sharded,\s+resulting\s+in\s+biased"
                     r"|cannot\s+be\s+performed\s+without\s+redistribution,\s+which\s+is\s+disallowed"
                     r"|Use\s+reduction='sum'\s+or\s+'none'\s+instead")
"""DTensor's explicit refusals of placements an op cannot take as given ("... requires
redistribution. Please redistribute the input first"): upstream names the limit and what to
do, nothing is computed wrong, so the case is counted as a gap like a missing sharding
strategy (any whitespace between the words: torch's nll_loss message carries its source
line's indentation, "sharded,<25 spaces>resulting"; unbind along a sharded dim: "cannot be
performed without redistribution, which is disallowed by the current operator"; loss_parallel()'s
"reduction='mean' is only supported on one-dimensional DeviceMesh ... Use reduction='sum' or 'none'
instead", its documented limit on a 2-D mesh), never re-filed as a new find every night (DESIGN rule 10: refused is not broken,
and it stays visible in the gaps table). Only for the op's own call: a backward that refuses
the placements its own forward produced is a find (nobody can redistribute inside autograd)."""
INPLACE_REFUSED = re.compile(r"in-place operations that require placement changes are not supported")
"""DTensor's refusal of an in-place op whose result needs another placement than its input's
("Please use the out-of-place version"). A gap only where the caller itself wrote the in-place
op (a case drawn with `inplace=1`, as `loss += coef * aux` on a Partial loss): the caller can
write the out-of-place form. Inside an out-of-place op (F.rms_norm adding eps in place to a
Partial mean, label-smoothed cross_entropy's masked_fill_) the caller can do nothing, so there
it stays a find (dtensor-rms-norm-sharded-hidden and
dtensor-cross-entropy-label-smoothing-empty-shard were found that way)."""
def refused(case: OpCase, exc: Exception, during: str) -> bool:
    """Whether `exc` is a refusal the caller can act on (see REFUSED, INPLACE_REFUSED)."""
    if during != "the op":
        return False
    text = str(exc)
    wrote_in_place = bool(case.param.get("inplace")) or spec_of(case.op).inplace
    return bool(REFUSED.search(text)) or (wrote_in_place and bool(INPLACE_REFUSED.search(text)))


def _where(case: OpCase) -> str:
    return f"{case.op} on mesh {case.mesh}, {DTYPES[case.dtype]}, sizes {list(case.shapes)}, " \
           f"placements {[list(p) for p in case.placements]}, params {case.param}"


def _structure(what: str, got: torch.Tensor, ref: torch.Tensor) -> str | None:
    """None, or how `got`'s shape or dtype differs from the reference's."""
    if tuple(got.shape) != tuple(ref.shape):
        return f"{what}: shape: {tuple(got.shape)}, expected {tuple(ref.shape)}"
    if got.dtype != ref.dtype:
        return f"{what}: dtype: {got.dtype}, expected {ref.dtype}"
    return None


def _compare(what: str, got: torch.Tensor, ref: torch.Tensor, dtype: str, terms: int) -> str | None:
    """None, or the problem: where and by how much against the threshold."""
    if problem := _structure(what, got, ref):
        return problem
    if ref.numel() == 0:
        return None
    if not ref.is_floating_point():
        diff = (got != ref)
        if diff.any():
            idx = tuple(int(i) for i in diff.nonzero()[0])
            return f"{what}: value: differs at {idx} ({int(got[idx])} vs {int(ref[idx])}), exact expected"
        return None
    g, r = got.double(), ref.double()
    nan = g.isnan() != r.isnan()
    if nan.any():
        idx = tuple(int(i) for i in nan.nonzero()[0])
        return f"{what}: NaN: where the reference has none (or the other way) at {idx}"
    both = torch.isfinite(g) & torch.isfinite(r)
    if (torch.isinf(g) != torch.isinf(r)).any() or (torch.isinf(g) & (g != r)).any():
        return f"{what}: infinity: where the reference has none (or of the other sign)"
    err = torch.where(both, (g - r).abs(), torch.zeros_like(g))
    scale = max(float(torch.where(both, r.abs(), torch.zeros_like(r)).max()), 1.0)  # inputs are O(1)
    worst = float(err.max()) / scale
    # the coarser of the case's dtype and the result's (a cast to bf16 rounds each Partial share)
    names = [DTYPES.get(dtype, dtype), str(ref.dtype).replace("torch.", "")]
    limit, name = max((op_threshold(n, terms), n) for n in names if n in ROUNDING)
    if worst > limit:
        idx = tuple(int(i) for i in (err == err.max()).nonzero()[0])
        return (f"{what}: value: differs by {worst:.3g} of max(max|ref|, 1) ({worst / limit:.3g}x the {name} "
                f"threshold {limit:.2g}) first at {idx}: {float(g[idx]):.6g} vs {float(r[idx]):.6g}")
    return None


def _check_output(i: int, o, r: torch.Tensor, mesh, case: OpCase, terms: int, DTensor, compare=None
                  ) -> tuple[list[str], torch.Tensor | None]:
    """(the output's problems, its full_tensor()); `compare` judges the value (default: `_compare`)."""
    what = f"output {i}"
    if not isinstance(o, DTensor):
        return [f"{what}: type: a plain {type(o).__name__}, not a DTensor"], None
    bad = [p for p in o.placements if p.is_shard() and not -o.ndim <= p.dim < max(o.ndim, 1)]
    if len(o.placements) != mesh.ndim or bad:
        return [f"{what}: placements: {tuple(o.placements)} are not legal for a {o.ndim}-dim result on a "
                f"{mesh.ndim}-axis mesh"], None
    full, problem = _gathered(what, o)
    bad = problem or (compare or _compare)(what, full, r, case.dtype, terms)
    return ([bad] if bad else []), full


def expected_local_shape(shape: tuple[int, ...], placements, mesh) -> tuple[int, ...] | None:
    """The local shape torch's even-chunk sharding gives (None for _StridedShard: skipped)."""
    out = list(shape)
    for axis, p in enumerate(placements):
        if type(p).__name__ == "_StridedShard":
            return None
        if p.is_shard():
            d = p.dim + len(shape) if p.dim < 0 else p.dim
            n, c = mesh.size(axis), mesh.get_local_rank(axis)
            chunk = -(-out[d] // n) if out[d] else 0
            out[d] = max(0, min(chunk, out[d] - c * chunk))
    return tuple(out)


def _local_problem(outs, refs, mesh, DTensor) -> str | None:
    """The first output whose local shape on this rank is not what its placements say."""
    for i, (o, r) in enumerate(zip(outs, refs)):
        if not isinstance(o, DTensor) or tuple(o.shape) != tuple(r.shape) or len(o.placements) != mesh.ndim:
            continue
        local = expected_local_shape(tuple(o.shape), o.placements, mesh)
        if local is not None and tuple(o.to_local().shape) != local:
            return (f"output {i}: local shape: {tuple(o.to_local().shape)} on mesh coordinate "
                    f"{mesh.get_coordinate()}, its placements {tuple(o.placements)} of {tuple(o.shape)} say {local}")
    return None


def _everywhere(problem: str | None) -> str | None:
    """The first rank's problem, on every rank (a collective over the whole world: every
    rank runs every case, a submesh case on its own submesh)."""
    import torch.distributed as tdist

    everyone: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(everyone, problem)
    return next((p for p in everyone if p), None)


def _gathered(what: str, t) -> tuple[torch.Tensor | None, str | None]:
    """`t.full_tensor()`, or the problem that it raised (DTensor's own reduction failing)."""
    try:
        return t.full_tensor(), None
    except Exception as exc:
        return None, f"{what}: full_tensor raised: {error_signature(type(exc).__name__, str(exc))}"


def _loss(outputs, cotangents) -> torch.Tensor:
    return sum((o.float() * c).sum() for o, c in zip(outputs, cotangents) if c is not None)


def backward(case: OpCase, outputs, cotangents, done, ask) -> CaseOutcome | None:
    """The loss's backward, the ranks agreeing whether one raised: None to go on, else the outcome."""
    failed = None
    try:
        _loss(outputs, cotangents).backward()
    except Exception as exc:
        failed = _raised(case, exc, "the backward", done)
    return leave_if_raised(failed, ask)


def _raised(case: OpCase, exc: Exception, during: str, done) -> CaseOutcome:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, NotImplementedError) and GAP.search(str(exc)):
        out = done("gap", f"{case.op}: no sharding strategy", f"{during}: {text[:500]}")
    elif refused(case, exc, during):
        out = done("gap", f"{case.op}: refused, redistribute first", f"{during}: {text[:500]}")
    else:
        first = error_signature(type(exc).__name__, str(exc))
        # no op in it: one DTensor error (a redistribution it cannot do) is one find across ops
        signature = f"{during} raised {first}"[:240]
        out = done("fail", signature, f"{signature}\n  {text[:1500]}\n  case {case.id}\n  {_where(case)}")
    out.raised = True
    return out
