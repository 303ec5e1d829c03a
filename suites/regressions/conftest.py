"""Fixtures shared by the regression repros that run an inductor pass on a hand-built graph."""

from __future__ import annotations

import pytest

FAKE_BACKEND = "distci_fake"
FAKE_WORLD = 2


def init_fake_process_group(world_size: int = FAKE_WORLD):
    """A process group of `world_size` ranks in this one process that never communicates.

    Graph passes such as inductor's micro-pipeline TP only need a group's name and size;
    c10d's FakeProcessGroup provides them on every torch the matrix spans (its creation
    API changed in 2.10, hence the two registrations).
    """
    import torch.distributed as dist
    from torch._C._distributed_c10d import FakeProcessGroup

    if FAKE_BACKEND not in dist.Backend.backend_list:
        if hasattr(FakeProcessGroup, "_create_internal"):  # torch >= 2.10: extended API

            def create(common, backend_opts):
                return FakeProcessGroup._create_internal(common.group_rank, common.group_size, backend_opts)

            dist.Backend.register_backend(FAKE_BACKEND, create, extended_api=True, devices=["cpu", "cuda"])
        else:

            def create_legacy(store, rank, world_size, timeout):
                return FakeProcessGroup(rank, world_size)

            dist.Backend.register_backend(FAKE_BACKEND, create_legacy, devices=["cpu", "cuda"])
    dist.init_process_group(FAKE_BACKEND, store=dist.HashStore(), rank=0, world_size=world_size)
    return dist.group.WORLD


@pytest.fixture
def fake_group():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a default process group already exists in the pytest process")
    group = init_fake_process_group()
    try:
        yield group
    finally:
        dist.destroy_process_group()


def fuse_with_micro_pipeline_tp(gm, make_inputs, monkeypatch: pytest.MonkeyPatch):
    """Runs inductor's micro-pipeline TP pass over a hand-built post-grad graph `gm`.

    Fake tensors from `make_inputs()` give every node the metadata the pass reads. The
    pass rewrites graphs only on NCCL builds with symmetric memory enabled for the group;
    neither matters for a graph rewrite, and CPU-only wheels lack NCCL, so both are faked.
    Returns (fake mode, inputs, the fused scaled-matmul/reduce-scatter nodes).
    """
    import torch
    from torch._inductor.fx_passes.micro_pipeline_tp import micro_pipeline_tp_pass
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed import _symmetric_memory as symm_mem
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    mode = FakeTensorMode()
    with mode:
        inputs = make_inputs()
    FakeTensorProp(gm, mode).propagate(*inputs)
    with symm_mem._test_mode():
        micro_pipeline_tp_pass(gm.graph)
    fused = [n for n in gm.graph.nodes if n.target is torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter.default]
    return mode, inputs, fused


def partial_tp_mlp(dist, dim: int = 8, loss_scale: float = 1.0):
    """(model, reference) after one backward of the same batch (its loss times `loss_scale`): a
    LayerNorm, two linears and a head, the linears TP-sharded (w1 column-, w2 row-wise,
    torchtitan's feed-forward plan) without sequence parallel, so the norm and the head stay
    plain tensors beside DTensors; and its single-process twin. What the foreach paths that
    group gradients by device and dtype only (clip_grad_value_, GradScaler.unscale_) hand one
    kernel both kinds of."""
    import torch
    from torch import nn
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim),
                             nn.Linear(dim, dim)).to(dist.device)

    model, reference = build(), build()
    parallelize_module(model, dist.mesh(), {"1": ColwiseParallel(), "3": RowwiseParallel()})
    x = torch.randn(4, dim, generator=torch.Generator().manual_seed(1)).to(dist.device)
    for m in (model, reference):
        (m(x).pow(2).mean() * loss_scale).backward()
    return model, reference


def raised_on_ranks(dist, call) -> list[tuple[int, str]]:
    """[(rank, the first line of its RuntimeError)] for every rank on which `call()` raised.
    Every rank reaches the all-gather whatever it met, so a rank that raised before a
    collective leaves no peer waiting in it: the repro fails with the error, never a hang."""
    import torch.distributed as tdist

    try:
        call()
        raised = None
    except RuntimeError as exc:
        raised = str(exc).splitlines()[0]
    everyone: list = [None] * dist.world_size
    tdist.all_gather_object(everyone, raised)
    return [(rank, r) for rank, r in enumerate(everyone) if r]


def counting_aot_eager(graphs: list[int]):
    """A torch.compile backend that appends each graph's node count to `graphs`, then compiles
    it with aot_eager: what reaches a backend, counted the same way on every torch (Dynamo's own
    counters moved between releases). An empty `graphs` after a step: nothing was compiled."""
    from torch._dynamo.backends.registry import lookup_backend

    def backend(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return lookup_backend("aot_eager")(gm, example_inputs)
    return backend
