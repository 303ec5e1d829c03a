"""Zero-bubble pipeline schedules refuse stages whose blocks are compiled (2 ranks, 4 stages).

Trigger: torchtitan's order for PP with compile: each block `torch.compile`d (apply_compile),
then split into stages, then a schedule; with ScheduleZBVZeroBubble (or the interleaved zero
bubble / DualPipeV schedules, which split each backward into input and weight passes) the
schedule raises "The ScheduleZBVZeroBubble schedule is not supported with stage modules that
have used torch.compile" at construction. Upstream made it an error on purpose (PR #143599,
then #162511: the split backward segfaulted on compiled stages) and tracks support in
pytorch#161904 (open); torch 2.13.0 and 2.15.0 raise (CPU, gloo, 2026-12-08). A trainer that
compiles and picks a zero-bubble schedule meets a refusal, not a wrong number. Control:
Interleaved1F1B trains the same compiled stages to the single-process gradients.

Found by the models generator (`pp_tp-blocks2-plan_titan-zbv-...-compile_blocks`, the models
night run of 2026-12-08 on 2.13.0).
"""

from __future__ import annotations

import copy

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
ROWS, DIM, STAGES = 4, 4, 4


@pytest.mark.world_size(2)
@pytest.mark.parametrize("schedule", ["ScheduleZBVZeroBubble", "ScheduleInterleaved1F1B"],
                         ids=["zbv", "interleaved_1f1b_control"])
def test_a_schedule_trains_compiled_stages(dist, schedule: str) -> None:
    import torch.distributed as tdist
    from torch.distributed.pipelining import PipelineStage, schedules

    if dist.group is None:
        dist.init()
    torch._dynamo.reset()
    torch.manual_seed(0)
    full = torch.nn.Sequential(*[torch.nn.Linear(DIM, DIM) for _ in range(STAGES)])
    x, y = torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)
    rank = tdist.get_rank()
    mine = [rank, STAGES - 1 - rank] if schedule == "ScheduleZBVZeroBubble" else [rank, rank + 2]
    parts = {s: copy.deepcopy(full[s]) for s in mine}
    stages = [PipelineStage(torch.compile(parts[s], backend="aot_eager"), s, STAGES, dist.device) for s in mine]
    try:
        runner = getattr(schedules, schedule)(stages, n_microbatches=2, loss_fn=torch.nn.functional.mse_loss)
    except RuntimeError as exc:
        pytest.fail(f"{schedule} over compiled stages raised: {str(exc).splitlines()[0]}")
    runner.step(*((x,) if 0 in mine else ()), **({"target": y} if STAGES - 1 in mine else {}))
    torch.nn.functional.mse_loss(full(x), y).backward()
    for s in mine:
        for got, want in zip(parts[s].parameters(), full[s].parameters()):
            assert got.grad is not None and torch.allclose(got.grad, want.grad, rtol=1e-4, atol=1e-6), (
                f"stage {s} of {schedule}: a compiled stage's gradient is not the reference's")
