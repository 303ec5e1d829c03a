"""torchtitan 0.3.x: keyword-only configs, `Llama3Model`, sharding declared on the model.

`parallelize_llama(model, *, parallel_dims, training, parallelism, compile_config,
ac_config, dump_folder)` calls `model.parallelize(parallel_dims)` (the sharding configs
`set_llama3_sharding_config` put on the model config), then AC, per-block compile and,
always, `apply_fsdp_to_decoder` (at degree 1 it only installs the mixed-precision policy).
Async TP is `compile_config.enable_async_tensor_parallel`, enabled by
`compile._maybe_enable_async_tp(compile_config, tp_mesh)`.

Choices this adapter makes, and why:
- spmd_backend "partial_dtensor" (DTensor on the TP axis), not the default
  "spmd_types" (local tensors under torchtitan's SPMD type checker, with its own loss):
  it is the path whose placements, collectives and loss parallel the suite's checks read.
- torchtitan's own ScaledDotProductAttention as the inner attention (0.2.x's default):
  the debug model's FlexAttention has no backward on CPU, and with one document per
  sequence causal SDPA computes the same attention.
- float32 mixed-precision param/reduce dtypes: the FSDP wrapper at degree 1 would
  otherwise cast to bfloat16, and the reference is float32 (0.2.x trained TP-only jobs
  in float32).
- ParallelDims builds its own meshes for torchtitan's device type, which is "cuda" even
  on a CPU-only machine; the adapter points it at the harness's device type.
- Float8: not driven yet (its converters are model-config converters in 0.3.x); a Float8
  case skips with that reason.
"""

from __future__ import annotations

import inspect
from typing import Any

from . import Job

NAME = "0.3.x"
PARALLELIZE_KEYWORDS = ("parallel_dims", "training", "parallelism", "compile_config", "ac_config", "dump_folder")
SPMD_BACKEND = "partial_dtensor"


def probe() -> str:
    """"" when this torchtitan has the 0.3.x API, else what is missing."""
    try:
        from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig  # noqa: F401
        from torchtitan.distributed import ParallelDims  # noqa: F401
        from torchtitan.distributed import parallel_dims as _pd  # noqa: F401
        from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401
        from torchtitan.distributed.compile import _maybe_enable_async_tp  # noqa: F401
        from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: F401
        from torchtitan.models.llama3 import Llama3Model, llama3_configs, parallelize_llama  # noqa: F401
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config  # noqa: F401
    except Exception as err:  # noqa: BLE001 - a half-importable torchtitan is not this line either
        return f"{type(err).__name__}: {err}"
    params = inspect.signature(parallelize_llama).parameters
    missing = [k for k in PARALLELIZE_KEYWORDS
               if k not in params or params[k].kind is not inspect.Parameter.KEYWORD_ONLY]
    if missing:
        return f"parallelize_llama{tuple(params)} lacks the keyword-only {', '.join(missing)}"
    if SPMD_BACKEND not in str(inspect.signature(ParallelismConfig).parameters.get("spmd_backend", "")):
        return f"ParallelismConfig has no spmd_backend {SPMD_BACKEND!r}"
    if not hasattr(_pd, "device_type"):
        return "torchtitan.distributed.parallel_dims has no device_type to point at this device"
    return ""


def _parallelism(job: Job) -> Any:
    from torchtitan.config import ParallelismConfig

    return ParallelismConfig(tensor_parallel_degree=job.tp, enable_sequence_parallel=True, spmd_backend=SPMD_BACKEND)


def _compile_config(job: Job) -> Any:
    from torchtitan.config import CompileConfig

    kwargs = {"backend": job.backend} if job.backend else {}
    return CompileConfig(enable=job.compile, components=["model"] if job.compile else [],
                         enable_async_tensor_parallel=job.async_tp, **kwargs)


def _ac_config(job: Job) -> Any:
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if job.ac == "none":
        return None
    return {"full": FullAC.Config, "selective": SelectiveAC.Config}[job.ac]()


class Line03:
    name = NAME
    sharded = {"attention.qkv_linear.wqkv.weight": 0, "attention.wo.weight": 1, "feed_forward.w1.weight": 0,
               "feed_forward.w2.weight": 1, "feed_forward.w3.weight": 0, "tok_embeddings.weight": 0,
               "lm_head.weight": 0}

    def build_model(self, job: Job, device: Any, seed: int) -> Any:
        import torch
        from torchtitan.models.common.attention import ScaledDotProductAttention
        from torchtitan.models.llama3 import llama3_configs
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config

        config = llama3_configs["debugmodel"](attn_backend="flex")
        config.layers = config.layers[:job.n_layers]
        config.enable_weight_tying = job.tie
        for layer in config.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
        set_llama3_sharding_config(config, enable_sp=_parallelism(job).enable_sequence_parallel)
        with torch.device("meta"):
            model = config.build()
        model.to_empty(device=device)
        torch.manual_seed(seed)
        with torch.no_grad():
            model.init_weights(buffer_device=device)
        return model

    def vocab_size(self, model: Any) -> int:
        return model.config.vocab_size

    def forward(self, model: Any, tokens: Any) -> Any:
        return model(tokens)

    def convert_float8(self, model: Any, job: Job) -> None:
        import pytest

        pytest.skip(f"the torchtitan {NAME} adapter does not drive Float8 yet (0.3.x converts model configs)")

    def parallelize(self, model: Any, job: Job, mesh: Any, world_size: int, device_type: str) -> Any:
        import tempfile

        import torchtitan.distributed.parallel_dims as titan_parallel_dims
        from torchtitan.config import TrainingConfig
        from torchtitan.distributed import ParallelDims
        from torchtitan.models.llama3 import parallelize_llama

        titan_parallel_dims.device_type = device_type
        parallelism = _parallelism(job)
        dims = ParallelDims.from_config(parallelism, world_size)
        training = TrainingConfig(seq_len=job.seq_len, mixed_precision_param="float32",
                                  mixed_precision_reduce="float32")
        with tempfile.TemporaryDirectory(prefix="distci-titan-") as dump:
            return parallelize_llama(model, parallel_dims=dims, training=training, parallelism=parallelism,
                                     compile_config=_compile_config(job), ac_config=_ac_config(job),
                                     dump_folder=dump)

    def loss_parallel(self, job: Job) -> bool:
        return True  # 0.3.x has no switch: the lm_head output stays vocab-sharded under TP

    def enable_async_tp(self, mesh: Any) -> None:
        from torchtitan.distributed.compile import _maybe_enable_async_tp

        _maybe_enable_async_tp(_compile_config(Job(n_layers=1, seq_len=1, tp=mesh.size(), compile=True,
                                                   async_tp=True)), mesh)


LINE = Line03()
