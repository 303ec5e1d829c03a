"""FSDP2 with torchao's float8 all-gather raises under torch.inference_mode() (pytorch#170419's face).

Trigger: a model converted with `convert_to_float8_training(..., Float8LinearConfig(
enable_fsdp_float8_all_gather=True))` (torchtitan's float8 + FSDP2 setup), sharded with
`fully_shard`, then a forward under `torch.inference_mode()` (an eval loop, torchtune's and
TRL's generation for RL): the sharded weight's local tensor is torchao's wrapper subclass
WeightWithDynamicFloat8CastTensor, created outside inference mode, and FSDP2 takes views of it
(`reset_sharded_param`'s `local_tensor.view(-1)` at the first forward, the unshard's after a
training step). A view of a wrapper subclass made outside inference mode, taken inside it, raises
"Cannot set version_counter for inference tensor": pytorch#170419 (open), its repro a bare
wrapper subclass; ao PR#3488 fixed torchao's inference Float8Tensor's transpose, not this
training subclass. Controls: the same under no_grad, float8 without the float8 all-gather, and
FSDP2 without float8 all run.

Found by the programs generator (fsdp_f8, seed 2026-12-07-f8, torch 2.13.0 CPU, fixes off, 2026-12-07)
as fsdp_f8-ws2-w8-l3-adamw_groups:fwd_bwd,zero_grad=zeros,eval=inference_mode,..., shrunk to
fsdp_f8-ws2-w8-l1-sgd:eval=inference_mode; reproduced on 2.13.0 and 2.15.0 (torchao 0.18.0).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")

CASES = {
    # name: (float8, float8 all-gather, inference_mode (else no_grad), a training step first)
    "first_forward_inference_mode": (True, True, True, False),
    "after_a_step_inference_mode": (True, True, True, True),
    "no_grad_control": (True, True, False, True),
    "no_float8_all_gather_control": (True, False, True, True),
    "no_float8_control": (False, False, True, True),
}


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_a_float8_fsdp2_model_runs_an_inference_mode_forward(dist, case: str) -> None:
    pytest.importorskip("torchao.float8")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from ..runner.parallelize import fsdp_api

    float8, all_gather, inference, trained = CASES[case]
    fully_shard, _ = fsdp_api()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    if float8:
        convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather,
                                                                    emulate=dist.device_type != "cuda"))
    fully_shard(model[0], mesh=dist.mesh())
    fully_shard(model, mesh=dist.mesh())
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    if trained:
        model(x).sum().backward()
    with torch.inference_mode() if inference else torch.no_grad():
        out = model(x)
    assert out.shape == (8, 16)
