"""Runs the scenario table (suites/scenario/table.py): every row, on every rank of the pool.

Each scenario trains the parallel model and its single-process reference for a few
steps and must match it in loss and gradients (and the eval forward) within the
tolerances beside the table, and must show the graph its features imply (compiled
graphs, no breaks, recompiles within budget, no step that fell back to eager, scaled
matmuls for Float8, fused symmetric-memory matmuls for async TP, FSDP2's all-gather and
reduce-scatter counts, frozen weights without gradients, MoE routing with an idle expert).
"""

from __future__ import annotations

import pytest

from .judges.checks import check_graph, check_numerics, check_routing, expected_graph, require
from .conftest import tier_marks
from .scenario.devices import suite_device
from .scenario.table import TABLE, Scenario
from .judges.tolerances import BF16_COMM_HOOK, tolerance
from .runner.reference import run_reference
from .runner.routing import edge_problems
from .runner.training import run_parallel

TIMEOUT_S = {"none": 180, "eager": 300, "aot_eager": 300, "inductor": 900}
"""Per-test timeout by compile backend: CPU inductor compiles (C++) of both ranks share
two cores in CI; GPU runs take a fraction of this."""


def timeout_of(scenario: Scenario) -> int:
    return TIMEOUT_S[scenario.backend] * (2 if scenario.world_size > 2 else 1) * (2 if scenario.shapes == "varlen" else 1)


def tolerance_of(scenario: Scenario, device_dtype: str):
    """Mixed-precision rows compute in bf16 whatever the device trains in: bf16 tolerances;
    a float32 row whose DDP hook all-reduces in bf16: that one rounding's."""
    compute = scenario.compute_dtype or device_dtype
    if scenario.ddp_hook == "bf16" and compute == "float32" and scenario.float8 == "none":
        return BF16_COMM_HOOK
    return tolerance(compute, scenario.float8)


def marks_of(scenario: Scenario) -> list:
    marks = [pytest.mark.world_size(scenario.world_size), pytest.mark.dist_timeout(timeout_of(scenario)),
             *tier_marks(scenario.tier)]
    if scenario.async_tp:
        # Symmetric memory is process-global state (enabled groups, workspaces) that the
        # rank pool's per-test reset does not undo: each async-TP scenario gets fresh
        # processes and its own process group under torchrun.
        marks.append(pytest.mark.torchrun(nproc=scenario.world_size))
    return marks


def params() -> list:
    return [pytest.param(s, id=s.id, marks=marks_of(s)) for s in TABLE]


def scenario_problems(dist, scenario: Scenario, mutation=None) -> list[str]:
    """Train `scenario` and its reference on this rank; every check's problems (the fuzzer's
    entry, suites/fuzz_entry.py, judges its configurations with this too)."""
    if dist.group is None:  # torchrun mode: this test owns its process group
        dist.init()
    dtype = suite_device(dist.device_type).dtype
    reference = run_reference(scenario, dist.device, dtype)
    run, evidence = run_parallel(scenario, dist.mesh, dist.device, dtype, mutation)
    problems = check_numerics(reference, run, tolerance_of(scenario, dtype))
    problems += check_routing(reference)
    problems += edge_problems(reference, scenario.routing, scenario.dp_degree * scenario.accum)
    problems += check_graph(expected_graph(scenario, scenario.train_dtype_override or dtype), evidence)
    return problems


@pytest.mark.parametrize("scenario", params())
def test_scenario(dist, scenario: Scenario) -> None:
    dtype = suite_device(dist.device_type).dtype
    require(scenario_problems(dist, scenario), f"{scenario.id} on {dist.world_size} {dist.device_type} ranks "
            f"({scenario.train_dtype_override or dtype}{f', mp {scenario.mp}' if scenario.mp != 'none' else ''})")
