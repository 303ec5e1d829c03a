"""torchtitan 0.3.0 + torch 2.13.0: a TP block compiled under activation checkpointing
fails its forward: AOTAutograd finds a DeviceMesh among the values it saves for backward
(found by distci; no upstream issue yet).

suites/test_torchtitan.py's `compile_*-ac_*` cases (aot_eager + selective AC, inductor +
full AC) fail on CPU with

    AssertionError: expected all tensors_saved_with_vc_check to be Tensors, got types:
    [<class 'torch.Tensor'>, ..., <class 'torch.distributed.device_mesh.DeviceMesh'>]

raised by AOTAutograd's `save_from_forward`, while the same cases without AC, and with
AC but eager, match the TP=1 reference. Narrowed by hand: one layer, TP=2, aot_eager and
full AC reproduce it with or without torchtitan's degree-1 FSDP wrapper; TP=1 does not.
A DTensor matmul, redistribute and local_map under a compiled checkpoint alone do not:
the mesh comes from torchtitan 0.3's sharding-config wrapper (`forward_with_redistribution`)
inside the checkpointed block.

The test trains one step of a 1-layer llama3 through the torchtitan adapter of the
installed API line with compile (aot_eager) and full AC; `ac_none` is the control.
torchtitan 0.2.x runs the same job through its own API (it passes there).
"""

from __future__ import annotations

import importlib.util

import pytest

from ..conftest import tier_marks

pytestmark = [
    *tier_marks("pr"),
    pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                       reason="torchtitan is not installed in this cell"),
]


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(600)
@pytest.mark.parametrize("ac", ["full", "none"], ids=["ac_full", "ac_none"])
def test_compiled_tp_block_under_ac_trains(dist, ac: str) -> None:
    import torch

    from ..titan import Job, select_or_skip

    line = select_or_skip()
    job = Job(n_layers=1, seq_len=16, tp=dist.world_size, compile=True, backend="aot_eager", ac=ac)
    model = line.build_model(job, dist.device, seed=0)
    model = line.parallelize(model, job, dist.mesh(), dist.world_size, dist.device_type)
    tokens = torch.randint(0, line.vocab_size(model), (1, job.seq_len), generator=torch.Generator().manual_seed(1))
    out = line.forward(model, tokens.to(dist.device))
    out = out.full_tensor() if hasattr(out, "full_tensor") else out
    out.float().square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads, "no parameter received a gradient"
    assert all(torch.isfinite(g.full_tensor() if hasattr(g, "full_tensor") else g).all() for g in grads)
