"""A pipeline stage after the first runs its first training forward on uninitialized memory,
different on each rank of its TP group (4 ranks, a 2x2 ("pp", "tp") mesh).

Trigger: torchtitan's PP x TP layout, stages built without input shapes (its
`pipeline_llm`): at the schedule's first `step`, a stage after the first infers its shapes by
running its forward on a tensor made from the received metadata (`TensorMeta.to_tensor`:
`torch.empty`), in training mode with grad enabled. Every rank of one stage's TP group gets
its own uninitialized values, so a forward whose collectives depend on the data (a
per-expert MoE loop, HF Mixtral / torchtitan's for-loop path, whose experts are TP-sharded)
issues different collectives on the ranks of one TP group: gloo aborts ("Received data size
doesn't match expected size") or the ranks hang. Whatever the forward changes (a token
counter) changes from garbage. Seen on torch 2.13.0 and 2.15.0 (CPU, gloo, 2026-12-07): the
first step's first forward of stage 1 sees values like 1e+21 where stage 0 sent values of
order 1. The second step (shapes known) sees only what stage 0 sent: the control. Found by
the models generator's `pp_tp-moe2-attn-mb4-split_last` (a crash; no upstream issue found:
reports/upstream-pp-shape-inference-uninitialized-input.md). Related, registered apart: the
extra forward's side effects on real data (test_pp_shape_inference_extra_forward.py).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")
ROWS, DIM, MICROBATCHES = 4, 4, 2


class Recording(torch.nn.Module):
    """A linear layer that keeps every input its training forwards see."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(DIM, DIM)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen.append(x.detach().clone())
        return self.lin(x)


@pytest.mark.world_size(4)
@pytest.mark.parametrize("step", [0, 1], ids=["first_step", "second_step"])
def test_a_later_stage_sees_only_what_the_stage_before_sent(dist, step: int) -> None:
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if dist.group is None:
        dist.init()
    mesh = init_device_mesh(dist.device_type, (2, 2), mesh_dim_names=("pp", "tp"))
    pp, tp = mesh["pp"].get_local_rank(), mesh["tp"].get_group()
    torch.manual_seed(0)
    first, later = torch.nn.Linear(DIM, DIM), Recording()
    module = (first, later)[pp]
    stage = PipelineStage(module, pp, 2, dist.device, group=mesh["pp"].get_group())
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=torch.nn.functional.mse_loss)
    x, y = torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)
    for _ in range(step + 1):
        later.seen = []
        schedule.step(*((x,) if pp == 0 else ()), **({"target": y} if pp == 1 else {}))
    problems = []
    if pp == 1:
        sent = first(x).detach().chunk(MICROBATCHES)
        for i, seen in enumerate(later.seen):
            if not any(torch.allclose(seen, s) for s in sent):
                problems.append(f"forward {i} of step {step} saw no microbatch stage 0 sent "
                                f"(max |x| {float(seen.abs().max()):.3g})")
        every: list = [None] * tdist.get_world_size(tp)
        tdist.all_gather_object(every, [s.tolist() for s in later.seen], group=tp)
        if any(e != every[0] for e in every):
            problems.append("the ranks of stage 1's TP group saw different inputs")
    everyone: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(everyone, problems)
    found = [f"rank {r}: {p}" for r, ps in enumerate(everyone) for p in ps]
    assert not found, "a stage ran a training forward on data no stage sent: " + "; ".join(found)
