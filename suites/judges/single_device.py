"""The world-size-1 slice of the scenario table: what one GPU (or one CPU) can check.

Most of what a row of the table (suites/scenario/table.py) trains runs on every rank the same
way it would run on one device: inductor's code for a block under AC, Float8's scaled
matmuls and casts, bf16 autocast, the optimizer step, recompiles on a new sequence
length. `single_device_slice()` projects every row onto one device, resetting the columns
only a mesh gives (the parallel layout, world size, async TP, a DCP resume into another
layout, loss parallel) to their one-device values, and keeps one row per resulting id,
in the earliest tier of the rows it came from (`nightly` at the earliest). A row added
to the table joins the slice by itself: nothing here names a row.

A slice row is judged against what one device computes without any of the row's
features: the same model and data, eager, float32, no Float8, no mixed precision, no AC
(`reference_of`), with the same checks and graph evidence as the table's rows (no graph
break, no recompile past the budget, no step that fell back to eager, scaled matmuls in
the post-grad graph for compiled Float8). One exception: a MoE row that computes in
reduced precision is judged against the same precision, eager, because routing is
discontinuous (a token whose top-k scores tie within bf16 rounding picks another
expert, and that expert's gradient is then wholly another sum; checks.compare_routing),
and a compiled one's gradients are judged at the first step (routing_unobservable).
"""

from __future__ import annotations

import dataclasses
import math

from ..scenario.table import TABLE, TIERS, Scenario
from .tolerances import Tolerance, tolerance, truth_tolerance

ONE_DEVICE = {"parallel": "single", "world_size": 1, "async_tp": False, "resume": "none", "dcp": "sync",
              "loss_parallel": False, "schedule": "none", "offload": False, "reshard": "titan", "prefetch": "implicit",
              "init": "seed"}
"""The columns only a mesh gives, at their one-device value: no layout to resume into,
vocab-parallel cross entropy is plain cross entropy on one shard, no pipeline schedule,
no FSDP2 offload, resharding or prefetch, no rank 0 to broadcast a full state dict from."""


FIRST_TIER = "nightly"
"""The earliest tier a slice row runs in: the `pr` tier's ten minutes on two CPU cores
belong to the table's own rows, which a slice row only repeats without a mesh."""


def on_one_device(row: Scenario) -> Scenario | None:
    """`row` on one device (parallel `single`, world size 1); None when a column that is
    left needs a mesh (the table's validation says which)."""
    try:
        return dataclasses.replace(row, **ONE_DEVICE)
    except ValueError:
        return None


def single_device_slice(table: list[Scenario] = TABLE) -> list[Scenario]:
    """One row per distinct one-device projection of `table`, in its earliest source tier
    (FIRST_TIER at the earliest)."""
    rows: dict[str, Scenario] = {}
    for source in table:
        row = on_one_device(source)
        if row is None:
            continue
        if TIERS.index(row.tier) < TIERS.index(FIRST_TIER):
            row = dataclasses.replace(row, tier=FIRST_TIER)
        seen = rows.get(row.id)
        if seen is None or TIERS.index(row.tier) < TIERS.index(seen.tier):
            rows[row.id] = row
    return list(rows.values())


def compute_dtype(row: Scenario, device_dtype: str) -> str:
    """What the row's matmuls compute in: bf16 / fp16 under mixed precision, else the device's dtype."""
    return row.compute_dtype or device_dtype


def reference_of(row: Scenario, device_dtype: str) -> tuple[Scenario, str, Tolerance]:
    """(the reference row, the dtype it trains in, the tolerance the run is held to)."""
    plain = dict(compile="none", backend="none", loss_compile=False, ac="none", mp="none")
    precision = compute_dtype(row, device_dtype)
    if row.loss_scaled:  # judged by its loss scales too: the reference trains fp16 with the same GradScaler
        return dataclasses.replace(row, **{**plain, "mp": row.mp}), "float32", tolerance(precision, row.float8)
    if row.model_args.n_experts and precision != "float32":
        return dataclasses.replace(row, **plain), precision, tolerance(precision, row.float8)
    return dataclasses.replace(row, float8="none", **plain), "float32", truth_tolerance(precision, row.float8)


def routing_unobservable(row: Scenario, device_dtype: str) -> bool:
    """A compiled MoE row computing in reduced precision: its gradients are judged at the
    first step only (its losses, graph and kernels at every step).

    Its routing is not recorded (the hook that records an eager run's routing would break
    the compiled graph), and once a step has moved the weights, bf16 rounding can flip a
    near-tie between two experts' scores: one token then goes elsewhere and whole experts'
    and the router's gradients differ from the eager reference's (measured on one H200,
    torch 2.11: step 0 within 25 dB everywhere, steps 1-2 down to 14 dB in one block's
    router and two experts, loss within 4.2e-5). An eager row's rerouting is judged by
    checks.compare_routing instead.
    """
    return bool(row.model_args.n_experts) and row.compiled and compute_dtype(row, device_dtype) != "float32"


def first_step_gradients(record):
    """`record` (an evidence.TrainRecord) with every loss but only the first step's gradients."""
    return dataclasses.replace(record, grads=record.grads[:1])


def numbers(ref, run) -> str:
    """The run's distance from its reference, for the report: worst loss difference and
    least gradient SQNR (step and parameter)."""
    from .checks import sqnr

    loss = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(run.losses, ref.losses)), default=math.nan)
    worst = (math.inf, "-")
    for step, (grads, ref_grads) in enumerate(zip(run.grads, ref.grads)):
        for name, g in grads.items():
            r = ref_grads.get(name)
            if g is not None and r is not None and g.shape == r.shape:
                db = sqnr(r, g)
                if db < worst[0]:
                    worst = (db, f"step {step} {name}")
    return f"loss max rel diff {loss:.3g}; grad min SQNR {worst[0]:.1f} dB ({worst[1]})"
