"""FSDP2: training after a first forward run under torch.inference_mode() raises.

Trigger: `fully_shard` a model, run its first forward under `torch.inference_mode()` (a
sanity-check validation before training, Lightning's `num_sanity_val_steps` under its default
inference mode; an eval of the initial weights), then a training forward. FSDP2's lazy init
runs inside that first forward, so what it allocates are inference tensors; the training
forward updates them in place and raises "Inplace update to inference tensor outside
InferenceMode is not allowed". `model.reshard()` between the two does not help. Controls: the
same eval under `torch.no_grad()`; the inference-mode eval after one training step (lazy init
already done); the same program in one process. Found by the programs generator as
`fsdp-ws4-w16-l1-sgd:eval=inference_mode,fwd_bwd,...`, shrunk to
`fsdp-ws2-w8-l1-sgd:eval=inference_mode,fwd_bwd`, torch 2.13.0 and 2.15.0 CPU, fixes off,
2026-12-06. Upstream: FSDP2 under inference mode, pytorch PR #197327 (a crash while
unsharding in inference mode) and torchtitan#3070 (FSDP skipped for inference for this reason).
"""

from __future__ import annotations

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


def _train_after_eval(dist, sharded: bool, eval_mode: str) -> None:
    """Eval (first forward, or after a training step), then one training forward/backward."""
    from ..runner.parallelize import fsdp_api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    if sharded:
        fully_shard, _ = fsdp_api()
        fully_shard(model[0], mesh=dist.mesh())
        fully_shard(model, mesh=dist.mesh())
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    if eval_mode == "inference_mode_after_a_step_control":
        model(x).sum().backward()
    model.eval()
    with torch.no_grad() if eval_mode == "no_grad_control" else torch.inference_mode():
        model(x)
    model.train()
    model(x).sum().backward()


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("eval_mode", ["inference_mode_first", "no_grad_control", "inference_mode_after_a_step_control"])
def test_training_forward_after_an_eval_forward(dist, eval_mode: str) -> None:
    _train_after_eval(dist, sharded=False, eval_mode=eval_mode)
    try:
        _train_after_eval(dist, sharded=True, eval_mode=eval_mode)
    except RuntimeError as error:
        pytest.fail(f"FSDP2: training after an eval forward ({eval_mode}) raised: {error}")
