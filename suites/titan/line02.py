"""torchtitan 0.2.x: one `JobConfig`, `parallelize_llama(model, parallel_dims, job_config)`.

The model is `Transformer(llama3_args["debugmodel"])`, Float8 comes from
`build_model_converters(job_config, parallel_dims)`, async TP from
`tensor_parallel.maybe_enable_async_tp(job_config, tp_mesh)`, loss parallel unless
`parallelism.disable_loss_parallel`. The trainer trains a TP-only job with float32
parameters (mixed precision comes with FSDP, which a TP-only job does not apply).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from . import Job

NAME = "0.2.x"
PARALLELIZE_PARAMS = ["model", "parallel_dims", "job_config"]


def probe() -> str:
    """"" when this torchtitan has the 0.2.x API, else what is missing."""
    try:
        from torchtitan.config import JobConfig  # noqa: F401
        from torchtitan.distributed import ParallelDims  # noqa: F401
        from torchtitan.models.llama3 import Transformer, llama3_args, parallelize_llama  # noqa: F401
        from torchtitan.protocols.model_converter import build_model_converters  # noqa: F401
    except Exception as err:  # noqa: BLE001 - a half-importable torchtitan is not this line either
        return f"{type(err).__name__}: {err}"
    params = list(inspect.signature(parallelize_llama).parameters)
    if params[:3] != PARALLELIZE_PARAMS:
        return f"parallelize_llama{tuple(params)} does not start with {tuple(PARALLELIZE_PARAMS)}"
    return ""


def job_config(job: Job) -> Any:
    from torchtitan.config import JobConfig

    jc = JobConfig()
    jc.training.seq_len = job.seq_len
    jc.parallelism.tensor_parallel_degree = job.tp
    jc.parallelism.enable_async_tensor_parallel = job.async_tp
    jc.compile.enable = job.compile
    jc.compile.components = ["model"] if job.compile else []
    if job.backend:
        jc.compile.backend = job.backend
    jc.activation_checkpoint.mode = job.ac
    if job.ac == "selective":
        jc.activation_checkpoint.selective_ac_option = "op"
    if job.float8 != "none":
        jc.model.converters = ["quantize.linear.float8"]
        jc.quantize.linear.float8.recipe_name = job.float8
        jc.quantize.linear.float8.filter_fqns = list(job.float8_skip_fqns)
    return jc


def parallel_dims(mesh: Any, world_size: int) -> Any:
    """torchtitan's ParallelDims for pure TP, over the harness's mesh.

    torchtitan builds its own meshes for its default device type, which is "cuda" even
    on a CPU-only machine; handing it our mesh keeps its code paths and runs anywhere.
    """
    from torchtitan.distributed import ParallelDims

    class GivenMesh(ParallelDims):
        def get_mesh(self, dims):
            if dims in ("tp", ["tp"]):
                return mesh
            raise KeyError(f"only the tp mesh exists in this test, not {dims!r}")

    return GivenMesh(dp_replicate=1, dp_shard=1, cp=1, tp=world_size, pp=1, ep=1, etp=1, world_size=world_size)


class Line02:
    name = NAME
    sharded = {"attention.wq.weight": 0, "attention.wo.weight": 1, "feed_forward.w1.weight": 0,
               "feed_forward.w2.weight": 1, "tok_embeddings.weight": 0, "output.weight": 0}

    def build_model(self, job: Job, device: Any, seed: int) -> Any:
        import torch
        from torchtitan.models.llama3 import Transformer, llama3_args

        if job.tie:
            import pytest

            pytest.skip("torchtitan 0.2.x's llama3 has no weight tying (enable_weight_tying came with 0.3)")
        args = dataclasses.replace(llama3_args["debugmodel"], n_layers=job.n_layers, max_seq_len=job.seq_len)
        with torch.device("meta"):
            model = Transformer(args)
        model.to_empty(device=device)
        torch.manual_seed(seed)
        with torch.no_grad():
            model.init_weights(buffer_device=device)
        return model

    def vocab_size(self, model: Any) -> int:
        return model.model_args.vocab_size

    def forward(self, model: Any, tokens: Any) -> Any:
        return model(tokens)

    def convert_float8(self, model: Any, job: Job) -> None:
        from torchtitan.protocols.model_converter import build_model_converters

        build_model_converters(job_config(job), parallel_dims(None, job.tp)).convert(model)

    def parallelize(self, model: Any, job: Job, mesh: Any, world_size: int, device_type: str) -> Any:
        from torchtitan.models.llama3 import parallelize_llama

        parallelize_llama(model, parallel_dims(mesh, world_size), job_config(job))
        return model

    def loss_parallel(self, job: Job) -> bool:
        return not job_config(job).parallelism.disable_loss_parallel

    def enable_async_tp(self, mesh: Any) -> None:
        from torchtitan.distributed.tensor_parallel import maybe_enable_async_tp

        jc = job_config(Job(n_layers=1, seq_len=1, tp=mesh.size(), compile=True, async_tp=True))
        maybe_enable_async_tp(jc, mesh)


LINE = Line02()
