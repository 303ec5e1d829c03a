"""torchtitan 0.2.2 never applies its Float8 tensorwise TP styles: TP all-gathers stay in
high precision, and async TP cannot fuse them (silent; found by distci).

torchtitan registers its Float8 converter as "quantize.linear.float8" (and its own
integration tests enable it by that name), but parallelize_llama decides
`enable_float8_linear = "float8" in job_config.model.converters`, an exact list match
against the old name. So a tensorwise Float8 job gets plain Colwise/RowwiseParallel
instead of torchao's Float8ColwiseParallel / Float8RowwiseParallel /
PrepareFloat8ModuleInput:
- the sequence-parallel all-gathers move float32/bf16 instead of fp8 (2-4x the bytes);
- the fp8 cast (amax, scale, convert) sits between each all-gather and its scaled matmuls,
  so inductor's micro-pipeline TP pass finds no consumer matmul and fuses no all-gather.
  On 2xH200 (torch 2.11) suites/test_torchtitan.py's tensorwise async-TP case fused the
  reduce-scatters but 0 all-gathers. On CPU its post-grad graphs show float32 all-gathers
  feeding abs/mul/reshape; with the converter list also holding "float8", the same
  all-gathers are fp8 and feed 3 and 2 fusible scaled matmuls.
The same check is in torchtitan 0.2.2's llama4, qwen3, deepseek_v3 and gpt_oss.

The test (`registered_name`; `plus_old_name` is the control) runs torchtitan's parallelize_llama for a TP=2 tensorwise Float8 job (no
compile, no AC) and records the `enable_float8_tensorwise_tp` it hands to apply_tp (the
call itself is not made: the decision is the bug, and it needs no process group).
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


# The control: the list also holds the old name the check looks for; it must pass.
CONVERTERS = {"registered_name": [], "plus_old_name": ["float8"]}


@pytest.mark.parametrize("names", list(CONVERTERS))
def test_tensorwise_float8_job_gets_float8_tp_styles(names: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    try:
        from torchtitan.models.llama3.infra import parallelize as titan_parallelize
    except Exception as err:  # noqa: BLE001 - ImportError, or KeyError after a half-failed import
        pytest.skip(f"this torchtitan has no models.llama3.infra.parallelize: {err}")
    if "enable_float8_tensorwise_tp" not in titan_parallelize.apply_tp.__code__.co_varnames:
        pytest.skip("this torchtitan's apply_tp has no enable_float8_tensorwise_tp switch")
    from ..titan import Job, line02

    titan = Job(n_layers=2, seq_len=64, tp=2, float8="tensorwise")
    job = line02.job_config(titan)
    job.model.converters = list(job.model.converters) + CONVERTERS[names]
    seen: dict = {}
    monkeypatch.setattr(titan_parallelize, "apply_tp", lambda *args, **kwargs: seen.update(kwargs))
    model = line02.LINE.build_model(titan, torch.device("cpu"), seed=0)
    titan_parallelize.parallelize_llama(model, line02.parallel_dims(object(), 2), job)
    assert "enable_float8_tensorwise_tp" in seen, "parallelize_llama did not call apply_tp for a TP=2 job"
    assert seen["enable_float8_tensorwise_tp"], (
        f"torchtitan left Float8 tensorwise TP off for a job with model.converters={list(job.model.converters)} "
        f"and recipe {job.quantize.linear.float8.recipe_name!r}: TP all-gathers stay in high precision and "
        "async TP cannot fuse them")
