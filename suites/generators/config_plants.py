"""Bugs planted on purpose in the training path, for the tests that prove the fuzzer finds
and shrinks them (tests/test_fuzz_mutations.py). A real run never sets DISTCI_FUZZ_PLANT.

Each plant is written the way such bugs sit upstream: harmless in most configurations,
wrong in a combination, and quiet (training completes, nothing raises):
  - accum_drop: one parameter's gradient accumulation drops every microbatch after the
    first (only visible with accum >= 2);
  - float8_scale: one Float8 linear's output comes back with a wrong scale (only where a
    Float8 recipe is on);
  - ac_all_gather: FSDP2 skips the backward re-all-gather of checkpointed blocks (the
    blocks never reshard: only under FSDP with full activation checkpointing);
  - late_step_drop: one parameter's gradient is dropped from the second optimizer step on
    (a stale-state bug: only visible with steps >= 2, so it shrinks to `steps2`).
The two gradient plants hook the parameter itself: under FSDP2 the sharded parameter's
gradient is written by the reduce-scatter, outside autograd, so they are quiet there (a
draw under FSDP passes; the shrinker lands on TP).
"""

from __future__ import annotations

import os
from typing import Callable

PLANT_ENV = "DISTCI_FUZZ_PLANT"


def _accum_drop(scenario):
    from ..runner.evidence import Mutation

    def plant(model) -> None:
        param = model.layers["0"].feed_forward.w1.weight
        if not param.requires_grad:  # frozen rows: nothing accumulates into it
            return

        def drop_later_microbatches(grad):
            return grad * 0 if param.grad is not None else grad

        param.register_hook(drop_later_microbatches)
    return Mutation(after_parallelize=plant)


def _float8_scale(scenario):
    from ..runner.evidence import Mutation

    def plant(model) -> None:
        for module in model.modules():
            if type(module).__name__ == "Float8Linear":
                module.register_forward_hook(lambda mod, inp, out: out * 2.0)
                return
    return Mutation(after_parallelize=plant) if scenario.float8 != "none" else None


def _ac_all_gather(scenario):
    from ..runner.evidence import Mutation

    return Mutation(fsdp_reshard=False) if scenario.ac == "full" else None


def _late_step_drop(scenario):
    from ..runner.evidence import Mutation

    def plant(model) -> None:
        param = model.layers["0"].feed_forward.w1.weight
        forwards = [0]

        def count(module, args) -> None:
            forwards[0] += 1

        def drop_after_the_first_step(grad):
            return grad * 0 if forwards[0] > scenario.accum else grad

        model.register_forward_pre_hook(count)
        if param.requires_grad:
            param.register_hook(drop_after_the_first_step)
    return Mutation(after_parallelize=plant)


PLANTS: dict[str, Callable] = {"accum_drop": _accum_drop, "float8_scale": _float8_scale,
                               "ac_all_gather": _ac_all_gather, "late_step_drop": _late_step_drop}


def planted(scenario, name: str | None = None):
    """The Mutation of the plant named by `name` (default: $DISTCI_FUZZ_PLANT) for `scenario`, or None."""
    name = os.environ.get(PLANT_ENV, "") if name is None else name
    if not name:
        return None
    if name not in PLANTS:
        raise ValueError(f"{PLANT_ENV}={name!r} is not a plant; plants: {', '.join(PLANTS)}")
    return PLANTS[name](scenario)
