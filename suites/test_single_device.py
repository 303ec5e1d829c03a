"""Runs the world-size-1 slice of the scenario table (suites/judges/single_device.py) on one device.

Each row trains on one rank of a world-size-1 pool and must match its eager float32
reference in loss and gradients, and must show the graph its features imply (the
checks of the table's rows: graphs compiled, no break, no eager fallback, scaled matmuls
at runtime and in inductor's post-grad graph for Float8). On a one-GPU runner these are
the real kernels (inductor's Triton code, `_scaled_mm` on SM89/SM90, bf16); a CPU cell runs
the same rows as controls, a Float8 recipe that this CPU `_scaled_mm` lacks skipping
with the probe's reason (suites/probes/capabilities.py, applied by suites/conftest.py).
"""

from __future__ import annotations

import pytest

from .judges.checks import check_graph, check_numerics, check_routing, expected_graph, require
from .conftest import tier_marks
from .scenario.devices import suite_device
from .scenario.table import Scenario
from .judges.single_device import first_step_gradients, numbers, reference_of, routing_unobservable, single_device_slice
from .test_scenarios import timeout_of
from .runner.reference import run_reference
from .runner.routing import edge_problems
from .runner.training import run_parallel

SLICE = single_device_slice()


def params() -> list:
    return [pytest.param(s, id=s.id, marks=[pytest.mark.world_size(1), pytest.mark.dist_timeout(timeout_of(s)),
                                            *tier_marks(s.tier)]) for s in SLICE]


@pytest.mark.parametrize("scenario", params())
def test_single_device(dist, scenario: Scenario) -> None:
    device = dist.device
    dtype = suite_device(dist.device_type).dtype
    ref_row, ref_dtype, tol = reference_of(scenario, dtype)
    reference = run_reference(ref_row, device, ref_dtype)
    run, evidence = run_parallel(scenario, None, device, dtype)
    if routing_unobservable(scenario, dtype):
        print(f"distci: {scenario.id}: gradients judged at step 0 only (compiled routing in {dtype} is not recorded)")
        reference, run = first_step_gradients(reference), first_step_gradients(run)
    print(f"distci-numbers: {scenario.id} on {device.type} ({dtype}) vs {ref_dtype} eager: {numbers(reference, run)}",
          flush=True)
    problems = check_numerics(reference, run, tol)
    problems += check_routing(reference)
    problems += edge_problems(reference, scenario.routing, scenario.accum)
    problems += check_graph(expected_graph(scenario, scenario.train_dtype_override or dtype), evidence)
    require(problems, f"{scenario.id} on one {device.type} device ({scenario.train_dtype_override or dtype}"
                      f"{f', autocast {scenario.mp}' if scenario.mp != 'none' else ''}) vs eager {ref_dtype}")
