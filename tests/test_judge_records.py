"""The numeric judge fed TrainRecords directly: the learning rate after each step and the
clipped total norm, where a run and its reference may disagree in ways the losses and
gradients of later steps never show (the last step's update is read by no forward)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from suites.judges.checks import check_numerics  # noqa: E402
from suites.judges.tolerances import TOLERANCES  # noqa: E402
from suites.runner.evidence import TrainRecord  # noqa: E402

TOL = TOLERANCES[("float32", "none")]


def _record(lrs=None, norms=None) -> TrainRecord:
    steps = len(lrs or norms or [])
    return TrainRecord(losses=[1.0] * steps, grads=[{} for _ in range(steps)], lrs=lrs or [], grad_norms=norms or [])


def test_a_schedule_that_restarted_is_a_problem_and_split_groups_are_not():
    """A resume that made the scheduler again without its state: the LR after step 1 is
    warmup's first value again. The parallel run's extra group (DTensor and plain
    parameters apart) with the same LR is no problem."""
    ref = _record(lrs=[[0.5], [0.75], [1.0]])
    assert check_numerics(ref, _record(lrs=[[0.5, 0.5], [0.75, 0.75], [1.0, 1.0]]), TOL) == []
    problems = check_numerics(ref, _record(lrs=[[0.5], [0.25], [0.5]]), TOL)
    assert problems and problems[0].startswith("step 1: learning rates"), problems


@pytest.mark.parametrize("run, ref, agree", [
    (1.0, 1.0 + 1e-6, True),
    (math.nan, math.nan, True),  # a loss-scaled row's overflowing step, skipped on both sides
    (math.inf, math.inf, True),
    (math.nan, 2.0, False),
    (2.0, math.nan, False),  # a finite norm where the reference overflowed: the run missed the inf
    (math.inf, math.nan, False),
    (1.0, 1.1, False),
])
def test_clipped_norms_agree_only_where_both_sides_saw_the_same(run, ref, agree):
    problems = check_numerics(_record(norms=[ref]), _record(norms=[run]), TOL)
    assert (problems == []) is agree, problems
