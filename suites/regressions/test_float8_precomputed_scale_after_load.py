"""torchao float8 + FSDP2: a precomputed weight scale survives a load into the weight.

Trigger: a model converted with `convert_to_float8_training` (tensorwise,
`enable_fsdp_float8_all_gather=True`), sharded with `fully_shard`, whose loop calls
`precompute_float8_dynamic_scale_for_fsdp(model)` after each optimizer step (torchtitan's
float8 `post_optimizer_hook`), then loads a checkpoint into the live model mid-run
(`set_model_state_dict`, as a resume in process, a rollback after a loss spike, or torchft's
recovery from a peer does). The precomputed scale is a cache of each weight's amax, kept on the
weight's local tensor (`WeightWithDynamicFloat8CastTensor._precomputed_scale`); the load writes
the weight in place (`copy_`, which the subclass forwards to its inner tensor) and leaves the
cache alone, so the next FSDP2 all-gather casts the loaded weight to float8 with the pre-load
weight's scale: values past the old amax saturate at e4m3's max, the rest round at the wrong
scale. Nothing raises. The same model loaded without a precomputed scale, or precomputed again
after the load, computes what the weights say (the controls).

Found on the programs generator's `fsdp_f8` layout (issue 40's float8 round, torch 2.13.0 CPU,
emulated float8, fixes off, 2026-12-07): the layout's smoke program
`fsdp_f8-ws2-w16-l2-adamw:fwd_bwd,step=precompute,fwd_bwd,step,save,...,load,fwd_bwd` left the
reference at the first forward after the load ("gradient SQNR"), its `fsdp` twin did not. Reproduced on torch 2.13.0
and 2.15.0 with torchao 0.18.0. Searched pytorch/ao and torchtitan issues (precompute scale,
load / resume / checkpoint, stale scale): none. Draft:
reports/upstream-draft-float8-precomputed-scale-after-load.md.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")


def _loaded_outputs(dist, moment: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the precomputing model's output after the load, a never-precomputed twin's output after
    the same load): a checkpoint of weights W0, a step that halves them (precomputed after it
    as the loop does), then W0 loaded back."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp

    from ..runner.parallelize import fsdp_api

    fully_shard, _ = fsdp_api()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True,
                                                                emulate=dist.device_type != "cuda"))
    fresh = copy.deepcopy(model)
    for m in (model, fresh):
        fully_shard(m, mesh=dist.mesh())
    saved = copy.deepcopy(get_model_state_dict(model))
    with torch.no_grad():  # the optimizer step: the weights move
        for p in model.parameters():
            p.mul_(0.5)
    if moment != "never_precomputed_control":
        precompute_float8_dynamic_scale_for_fsdp(model)
    set_model_state_dict(model, saved)
    set_model_state_dict(fresh, saved)
    if moment == "precomputed_again_control":
        precompute_float8_dynamic_scale_for_fsdp(model)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1), device=dist.device_type)
    return model(x), fresh(x)


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
@pytest.mark.parametrize("moment", ["precomputed_before_load", "never_precomputed_control",
                                    "precomputed_again_control"])
def test_a_loaded_float8_model_computes_with_the_loaded_weights(dist, moment: str) -> None:
    pytest.importorskip("torchao.float8")
    out, expected = _loaded_outputs(dist, moment)
    diff = float((out - expected).abs().max())
    assert diff == 0.0, (
        f"after a load the float8 model's output is {diff:.3g} off (of {float(expected.abs().max()):.3g}): "
        "the load kept the precomputed scale of the weights it replaced")
