"""The programs generator's judge: what `compare` reads off both twins after every action
(distci/training_program.py's actions, suites/generators/programs.py's runner) and how it
words a divergence.

Numbers are judged as the suites judge them: losses and gradients by
checks.check_numerics, parameters and optimizer state by checks.sqnr, at the fp32 tolerance
(tolerances.py: TP/FSDP reorder sums only); fsdp_mp too, since its reference computes at the
mixed-precision policy's precision (program_precision.mixed_precision_reference); Muon at bfloat16's,
since it updates in bfloat16 (program_optimizers.precision). An optimizer state
entry with nothing in it counts as an entry (`(empty) of NAME`): a stateless optimizer's
reference keeps none. Every param group is compared: its parameters (by name) and its
hyperparameters (lr, weight_decay, ...), since a resume must restore each group's own.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..judges.checks import check_numerics, sqnr
from ..judges.tolerances import tolerance
from ..runner.evidence import TrainRecord, clean_name, placement_name
from .program_optimizers import precision
from . import program_hooks as hooks
from . import program_scaler as scaler


def _full(t: torch.Tensor) -> torch.Tensor:
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.detach().float().cpu()


def _params(twin: Any) -> dict[str, torch.Tensor]:
    return {n: _full(q) for n, q in twin.named.items()}


def _grads(twin: Any) -> dict[str, torch.Tensor | None]:
    return {n: None if q.grad is None else _full(q.grad) for n, q in twin.named.items()}


def placements(twin: Any) -> dict[str, str]:
    return {n: ",".join(map(placement_name, q.placements)) if hasattr(q, "placements") else "local"
            for n, q in twin.named.items()}


def _optimizer_state(twin: Any) -> dict[str, torch.Tensor]:
    names = {id(q): n for n, q in twin.named.items()}
    out = {}
    for q, state in twin.opt.state.items():
        for key, value in state.items():
            if torch.is_tensor(value):
                out[f"{key} of {names.get(id(q), '?')}"] = _full(value)
        if not state:  # an entry with nothing in it: a stateless optimizer keeps none at all
            out[f"(empty) of {names.get(id(q), '?')}"] = torch.zeros(())
    return out


def _close(what: str, ref: dict[str, torch.Tensor], run: dict[str, torch.Tensor], min_db: float) -> list[str]:
    missing, extra = sorted(set(ref) - set(run)), sorted(set(run) - set(ref))
    out = []
    for keys, how in ((extra, "the reference lacks"), (missing, "missing from the run")):
        if keys:  # the kinds of entry, not the names: the signature must not count the model's layers
            kinds = sorted({k.split(" of ")[0] if " of " in k else k.rsplit(".", 1)[-1] for k in keys})
            out.append(f"{what}: entries {how} ({', '.join(kinds)}; first {keys[0]})")
    if out:
        return out
    for key in sorted(ref):
        r, g = ref[key], run[key]
        if r.shape != g.shape:
            out.append(f"{what} {key}: shape {tuple(g.shape)} vs reference {tuple(r.shape)}")
        elif not bool(torch.isfinite(g).all()):
            out.append(f"{what} {key}: non-finite values")
        elif (db := sqnr(r, g)) < min_db:
            out.append(f"{what} {key}: SQNR {db:.1f} dB < {min_db:g} dB")
    return out


def _group_names(twin: Any) -> list[list[str]]:
    names = {id(q): n for n, q in twin.named.items()}
    return [sorted(names.get(id(q), "?") for q in group["params"]) for group in twin.opt.param_groups]


def param_groups(ref: Any, run: Any) -> list[str]:
    """Each param group of the run's optimizer against the reference's: the same parameters
    (by name) and the same hyperparameters. The lr first, as before groups were compared:
    `lr X vs reference Y` (group 0) is the signature a scheduler or lr bug leaves."""
    out = []
    ref_names, run_names = _group_names(ref), _group_names(run)
    if len(ref_names) != len(run_names):
        return [f"param groups: {len(run_names)} vs reference {len(ref_names)}"]
    for i, (ref_group, run_group) in enumerate(zip(ref.opt.param_groups, run.opt.param_groups)):
        where = "" if i == 0 else f"param group {i} "
        lr_ref, lr_run = ref_group["lr"], run_group["lr"]
        if abs(lr_ref - lr_run) > 1e-9 * max(abs(lr_ref), 1e-12):
            out.append(f"{where}lr {lr_run:.6g} vs reference {lr_ref:.6g}")
        if ref_names[i] != run_names[i]:
            first = sorted(set(ref_names[i]) ^ set(run_names[i]) or ref_names[i])[0]
            out.append(f"param group {i}: other parameters than the reference's (first {first})")
        for key in sorted((set(ref_group) | set(run_group)) - {"params", "lr"}):
            a, b = ref_group.get(key), run_group.get(key)
            # a tensor-valued lr or a list for a tuple (betas after a full load's broadcast)
            # holds the same value: compare values, not containers
            a, b = (float(x) if torch.is_tensor(x) else list(x) if isinstance(x, tuple) else x for x in (a, b))
            if a != b:
                out.append(f"param group {i} {key}: {b!r} vs reference {a!r}")
    return out


def clip_totals(totals: tuple[float, float] | None, rel: float) -> list[str]:
    """The total norm clip_grad_norm_ returned, run against reference: a clip that saw no
    gradient (0 where the reference's is not) says so in its own words, the face of
    parameters that hold none (FSDP2's unsharded ones after a backward that kept them)."""
    if totals is None:
        return []
    ref, run = totals
    if run == 0.0 and ref > 0.0:
        return [f"clip saw no gradient: total norm 0 where the reference's is {ref:.6g}"]
    if not math.isclose(run, ref, rel_tol=rel, abs_tol=1e-12):
        return [f"clip total norm {run:.6g} vs reference {ref:.6g}"]
    return []


def averaged(ref: Any, run: Any, min_db: float) -> list[str]:
    """The EMA copies (step=ema, program_hooks.py): every parameter and buffer of the run's EMA
    (an AveragedModel, or FSDP2's shadow of its shards; DTensors made full) against the
    reference's AveragedModel, and the update counts."""
    if ref.ema is None and run.ema is None:
        return []
    if ref.ema is None or run.ema is None:
        return [f"EMA copy: {'the run' if run.ema is not None else 'the reference'} alone holds one"]
    entries = [{n: _full(t) for n, t in hooks.entries(twin).items()} for twin in (ref, run)]
    out = _close("EMA", entries[0], entries[1], min_db)
    if int(ref.ema.n_averaged) != int(run.ema.n_averaged):
        out.append(f"EMA updates {int(run.ema.n_averaged)} vs reference {int(ref.ema.n_averaged)}")
    return out


def compare(p: Any) -> list[str]:
    """Every problem of the run against the reference after an action (empty: none)."""
    # fsdp_mp too: its reference computes as its ranks do; Muon updates in bfloat16 (program_optimizers.precision)
    tol = tolerance(precision(p.spec.optim), "none")
    problems: list[str] = []
    grads_ref = _grads(p.ref)
    grads_run = _grads(p.run) if not p.unsynced else grads_ref
    if p.ref.scaling is not None:  # a spiked step's gradients: overflowed on both sides, not compared by value
        grads_ref, grads_run, overflow = scaler.overflowed(grads_ref, grads_run)
        problems += overflow + scaler.problems(p)
        if any(scaler.ACROSS_RANKS in x for x in problems):
            # ranks that stepped and ranks that skipped hold optimizer states of other shapes:
            # gathering them would send the ranks into different collectives
            return problems
    ref_rec = TrainRecord(losses=[p.losses[0]] if p.losses else [], grads=[grads_ref])
    run_rec = TrainRecord(losses=[p.losses[1]] if p.losses else [], grads=[grads_run])
    problems += [x.removeprefix("step 0: ") for x in check_numerics(ref_rec, run_rec, tol)]
    problems += _close("parameter", _params(p.ref), _params(p.run), tol.grad_min_sqnr)
    problems += _close("optimizer state", _optimizer_state(p.ref), _optimizer_state(p.run), tol.grad_min_sqnr)
    problems += param_groups(p.ref, p.run)
    problems += averaged(p.ref, p.run, tol.grad_min_sqnr)
    problems += clip_totals(p.clip_totals, tol.grad_max_rel or 1e-3)
    buffers_ref = {n: b.float() for n, b in p.ref.model.named_buffers()}
    buffers_run = {clean_name(n): _full(b) for n, b in p.run.model.named_buffers()}
    problems += [f"{x} on rank {p.par.rank}" for x in _close("buffer", buffers_ref, buffers_run, 120.0)]
    trainable_ref = sorted(n for n, q in p.ref.named.items() if q.requires_grad)
    trainable_run = sorted(n for n, q in p.run.named.items() if q.requires_grad)
    for names, how in ((sorted(set(trainable_run) - set(trainable_ref)), "train in the run only"),
                       (sorted(set(trainable_ref) - set(trainable_run)), "are frozen in the run only")):
        if names:
            problems.append(f"requires_grad differs: parameters {how} (first {names[0]})")
    return problems


def lead(problems: list[str]) -> str:
    """The problem that names the bug best: the GradScaler's (a skip or a scale), optimizer state,
    lr, buffers and gradients
    before parameters and losses (which every such bug moves later)."""
    for word in ("GradScaler", "optimizer state", "lr ", "param group", "clip ", "buffer", "requires_grad", "gradient", "parameter", "EMA"):
        hit = next((x for x in problems if word in x), None)
        if hit:
            return hit
    return problems[0]
