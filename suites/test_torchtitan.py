"""torchtitan's own llama3 debug model through torchtitan's own parallelize_llama.

Our scenario table imitates torchtitan; this suite runs the real thing: torchtitan's
Transformer, its Float8 model converter, its apply_tp (with loss parallel, as its
trainer defaults to), async TP switch, apply_ac and per-block apply_compile, driven by a
JobConfig as torchtitan's trainer would. Three AdamW steps on generated tokens at TP=2
are compared with the same model on one process (TP=1, eager, same converters), in loss
and in every gradient, and the compile evidence is judged as in the scenario table.

The torchtitan version comes with the cell (matrix.toml); the suite skips when
torchtitan is not installed and fails when it is installed but does not import.
Supported API: torchtitan 0.2.x (`parallelize_llama(model, parallel_dims, job_config)`);
another API is skipped with the reason, so a new release shows up as a skip to adapt,
not as a silent pass.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import inspect
import itertools
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from .checks import FLOAT8_MMS_PER_LINEAR, GraphExpectation, block_graphs, check_graph, check_numerics, require
from .conftest import tier_marks
from .parallelize import CompileCounter, count_float8_linears
from .scenarios import tolerance
from .training import Evidence, TrainRecord, count_executed_ops, full_grads, inductor_probe, placements

N_LAYERS, SEQ, BATCH, STEPS, SEED, LR = 2, 64, 2, 3, 20251130, 1e-3
DTYPE = "float32"
"""torchtitan trains TP-only jobs with float32 parameters (mixed precision comes with FSDP)."""

_backend_ids = itertools.count()


@dataclass(frozen=True)
class TitanCase:
    compile: bool
    backend: str  # none | aot_eager | inductor
    ac: str  # none | full | selective (torchtitan's op policy)
    float8: str  # none | tensorwise | rowwise
    async_tp: bool
    tier: str

    @property
    def id(self) -> str:
        parts = ["tp_sp_lossparallel", f"compile_{self.backend}" if self.compile else "eager"]
        if self.ac != "none":
            parts.append(f"ac_{self.ac}")
        if self.float8 != "none":
            parts.append(f"f8_{self.float8}")
        if self.async_tp:
            parts.append("asynctp")
        return "-".join(parts)

    def marks(self) -> list:
        marks = [pytest.mark.world_size(2), pytest.mark.dist_timeout(900), *tier_marks(self.tier)]
        if self.float8 != "none":
            # torchtitan's Float8 converter refuses to convert without SM89 (except in an
            # emulation mode that runs no scaled matmul), so its Float8 path is CUDA-only.
            marks.append(pytest.mark.requires_accelerator("cuda"))
            marks.append(pytest.mark.requires_sm(89 if self.float8 == "tensorwise" else 90))
        if self.async_tp:
            marks.append(pytest.mark.requires_accelerator("cuda"))
            marks.append(pytest.mark.requires_sm(90))
            # Symmetric memory is process-global: fresh processes, as in test_scenarios.
            marks.append(pytest.mark.torchrun(nproc=2))
        return marks


CASES = [
    TitanCase(False, "none", "none", "none", False, "nightly"),
    TitanCase(False, "none", "full", "none", False, "nightly"),
    TitanCase(True, "inductor", "none", "none", False, "nightly"),
    TitanCase(True, "aot_eager", "selective", "none", False, "nightly"),
    TitanCase(True, "inductor", "full", "none", False, "nightly"),
    TitanCase(True, "inductor", "selective", "rowwise", False, "nightly"),
    TitanCase(True, "inductor", "none", "tensorwise", False, "nightly"),  # the control of the next one
    TitanCase(True, "inductor", "none", "tensorwise", True, "nightly"),
    TitanCase(True, "inductor", "full", "rowwise", True, "nightly"),
]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                                reason="torchtitan is not installed in this cell")


def _job_config(case: TitanCase, backend: str | None):
    from torchtitan.config import JobConfig

    jc = JobConfig()
    jc.training.seq_len = SEQ
    jc.parallelism.tensor_parallel_degree = 2
    jc.parallelism.enable_async_tensor_parallel = case.async_tp
    jc.compile.enable = case.compile
    jc.compile.components = ["model"] if case.compile else []
    if backend:
        jc.compile.backend = backend
    jc.activation_checkpoint.mode = case.ac
    if case.ac == "selective":
        jc.activation_checkpoint.selective_ac_option = "op"
    if case.float8 != "none":
        jc.model.converters = ["quantize.linear.float8"]
        jc.quantize.linear.float8.recipe_name = case.float8
        jc.quantize.linear.float8.filter_fqns = ["output"]
    return jc


def _parallel_dims(mesh, world_size: int):
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


def _model(device: torch.device):
    from torchtitan.models.llama3 import Transformer, llama3_args

    args = dataclasses.replace(llama3_args["debugmodel"], n_layers=N_LAYERS, max_seq_len=SEQ)
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device=device)
    torch.manual_seed(SEED)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    return model


def _train(model, params_of, device, loss_parallel: bool, on_step=None) -> TrainRecord:
    """AdamW steps on generated tokens; `on_step(step)` may wrap a step in a context."""
    from torch.distributed.tensor.parallel import loss_parallel as loss_parallel_ctx

    gen = torch.Generator().manual_seed(SEED + 1)
    vocab = model_vocab(params_of)
    opt = torch.optim.AdamW(params_of.parameters(), lr=LR)
    record = TrainRecord()
    for step in range(STEPS):
        tokens = torch.randint(0, vocab, (BATCH, SEQ), generator=gen).to(device)
        labels = torch.randint(0, vocab, (BATCH, SEQ), generator=gen).to(device)
        with on_step(step) if on_step else contextlib.nullcontext():
            opt.zero_grad(set_to_none=True)
            pred = model(tokens)
            with loss_parallel_ctx() if loss_parallel else contextlib.nullcontext():
                loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
                loss.backward()
        value = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        record.losses.append(float(value.detach().cpu()))
        record.grads.append(full_grads(params_of))
        opt.step()
    return record


def model_vocab(model) -> int:
    return model.model_args.vocab_size


def _count_graphs_backend(counter: CompileCounter) -> str:
    """Registers `counter` under a fresh backend name, so torchtitan's apply_compile uses it."""
    from torch._dynamo.backends.registry import register_backend

    name = f"distci_counting_{next(_backend_ids)}"
    register_backend(compiler_fn=counter, name=name)
    return name


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks()) for c in CASES])
def test_torchtitan_llama3(dist, case: TitanCase) -> None:
    if dist.group is None:  # torchrun (async TP): this test owns its process group
        dist.init()
    import torchtitan
    from torchtitan.models.llama3 import parallelize_llama
    from torchtitan.protocols.model_converter import build_model_converters

    params = list(inspect.signature(parallelize_llama).parameters)
    if params[:3] != ["model", "parallel_dims", "job_config"]:
        pytest.skip(f"torchtitan {getattr(torchtitan, '__version__', '?')}: parallelize_llama{tuple(params)} "
                    "is a newer API than this suite's adapter (0.2.x)")

    device = dist.device
    model = _model(device)
    reference = copy.deepcopy(model)
    counter = CompileCounter(case.backend) if case.compile else None
    jc = _job_config(case, _count_graphs_backend(counter) if counter else None)
    parallel_dims = _parallel_dims(dist.mesh(), dist.world_size)
    if case.float8 != "none":
        build_model_converters(jc, parallel_dims).convert(reference)
        build_model_converters(jc, parallel_dims).convert(model)
    ref_record = _train(reference, reference, device, loss_parallel=False)

    evidence = Evidence(compiled=case.compile, float8_linears=count_float8_linears(model))
    probe = inductor_probe(evidence) if case.backend == "inductor" else contextlib.nullcontext()
    with probe:
        parallelize_llama(model, parallel_dims, jc)
        evidence.placements = placements(model)

        def on_step(step: int):
            if step == 1 and counter is not None:
                evidence.graphs_after_first_step = counter.graphs
            return count_executed_ops(evidence.runtime_ops) if step == STEPS - 1 else contextlib.nullcontext()

        record = _train(model, model, device, loss_parallel=not jc.parallelism.disable_loss_parallel,
                        on_step=on_step)
    if counter is not None:
        evidence.graphs_total = counter.graphs

    expect = GraphExpectation(graphs=block_graphs(N_LAYERS) if case.compile else (0, 0),
                              sharded={"attention.wq.weight": 0, "attention.wo.weight": 1,
                                       "feed_forward.w1.weight": 0, "feed_forward.w2.weight": 1,
                                       "tok_embeddings.weight": 0, "output.weight": 0})
    if case.float8 != "none":
        expect.float8_linears = 7 * N_LAYERS
        expect.min_scaled_mm = expect.float8_linears * FLOAT8_MMS_PER_LINEAR[case.float8]
        expect.post_grad_scaled_mm = case.backend == "inductor"
    else:
        expect.forbid_scaled_mm = True
    expect.fused_async_tp = case.async_tp

    problems = check_numerics(ref_record, record, tolerance(DTYPE, case.float8))
    problems += check_graph(expect, evidence)
    require(problems, f"torchtitan {getattr(torchtitan, '__version__', '?')} llama3 {case.id} "
                      f"at TP={dist.world_size} vs TP=1 on {dist.device_type}")
