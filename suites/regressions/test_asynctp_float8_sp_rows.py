"""Float8 + async TP + sequence parallel: the fused scaled-matmul/reduce-scatter hands each
rank the wrong rows when the batch is larger than 1 (found by distci's scenario table).

With sequence parallelism a row-parallel linear's partial output (B, S, N) is
reduce-scattered along the sequence, dim 1. For Float8, the matmul is torchao's
`reshape(B*S, K) -> _scaled_mm -> reshape(B, S, N)`, and inductor's micro-pipeline TP
pass turns that into `symm_mem.fused_scaled_matmul_reduce_scatter(A_2d, ...,
orig_scatter_dim=1, scatter_dim_after_maybe_reshape=0, output_shape=[B, S, N])`.
The op (torch 2.8 to 2.14.1 at least) then chunks the 2-D A by rows, which are
batch-major: rank r reduces the rows of batch chunk r, and the result is re-read as if
it were sequence chunk r. That is right only for B == 1. On 2×H200 (torch 2.11) every
Float8 + async-TP scenario of suites/scenario/table.py matches the reference loss but has
gradients at 3-11 dB SQNR: the backward of the column-parallel input (a reduce-scatter
along the sequence) is where the pass fuses.

Two ways to run the op, same check (each rank's output against an fp32 reference
of `sum over ranks of A_r @ B`, chunked along dim 1):
- `emulated`: the op's own Python implementation with its symmetric-memory all-to-all
  replaced by one built from all_gather, so CPU (gloo) and every torch version with the
  op run the op's real chunking logic;
- `symm_mem`: the registered CUDA op over symmetric memory (2 SM90 GPUs).
batch 1 is the control: it must pass with fixes off too.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import pytest
import torch

from ..probes import capabilities
from ..conftest import tier_marks

S, K, N = 16, 32, 32  # sequence S is split across the ranks; fp8 mm wants multiples of 16
MIN_SQNR_DB = 25.0  # bf16 rounding of exact fp8 products is ~50 dB; a row mix-up is ~0 dB


@dataclass(frozen=True)
class Case:
    via: str  # emulated | symm_mem
    batch: int
    scaling: str  # tensorwise | rowwise

    @property
    def id(self) -> str:
        return f"{self.via}-b{self.batch}-{self.scaling}"


CASES = [Case(via, batch, scaling) for via in ("emulated", "symm_mem") for batch in (1, 2)
         for scaling in ("tensorwise", "rowwise")]


def _marks(case: Case) -> list:
    marks = [pytest.mark.world_size(2), *tier_marks("pr" if case.via == "emulated" else "nightly")]
    if case.via == "symm_mem":
        marks += [pytest.mark.requires_accelerator("cuda"), pytest.mark.requires_sm(90),
                  pytest.mark.torchrun(nproc=2)]
    return marks


def _fp8(x: torch.Tensor, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Float8 e4m3 data and its float32 dequantization scale (per row, or one)."""
    amax = x.abs().amax(dim=-1, keepdim=True) if rowwise else x.abs().amax()
    scale = (448.0 / amax.float().clamp(min=1e-12))
    data = (x.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return data, scale.reciprocal()


def _sqnr(ref: torch.Tensor, got: torch.Tensor) -> float:
    noise = (ref - got).float().pow(2).sum().item()
    signal = ref.float().pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def _emulated_all2all(chunk_producer, output: torch.Tensor, group_name: str, out_chunk_dim: int = 0) -> None:
    """What `_pipelined_produce_and_all2all` computes, without symmetric memory."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    group = c10d._resolve_process_group(group_name)
    size, rank = group.size(), group.rank()
    mine = output.chunk(size, dim=out_chunk_dim)
    produced = torch.stack([torch.empty_like(mine[0]) for _ in range(size)])
    for dst in range(size):
        chunk_producer(dst, produced[dst])
    gathered = [torch.empty_like(produced) for _ in range(size)]
    dist.all_gather(gathered, produced, group=group)
    for src in range(size):
        mine[src].copy_(gathered[src][rank])


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=_marks(c)) for c in CASES])
def test_fused_scaled_mm_reduce_scatter_rows(dist, case: Case) -> None:
    import torch.distributed as d

    if dist.group is None:  # torchrun (symm_mem): this test owns its process group
        dist.init()
    symm_mem = pytest.importorskip("torch.distributed._symmetric_memory")
    impl = getattr(symm_mem, "_fused_scaled_matmul_reduce_scatter_impl", None)
    if impl is None or "scatter_dim_after_maybe_reshape" not in inspect.signature(impl).parameters:
        pytest.skip("this torch's fused scaled-matmul/reduce-scatter has no reshape-aware form")
    device = dist.device
    why = capabilities.scaled_mm(device.type, case.scaling)
    if why:
        pytest.skip(why)
    group = d.group.WORLD
    gen = torch.Generator().manual_seed(100 + dist.rank)
    a_hp = torch.randn(case.batch, S, K, generator=gen).to(device)
    w_hp = torch.randn(N, K, generator=torch.Generator().manual_seed(7)).to(device)
    rowwise = case.scaling == "rowwise"
    a_fp8, a_scale = _fp8(a_hp.reshape(-1, K), rowwise)
    w_fp8, w_scale = _fp8(w_hp, rowwise)
    b_scale = w_scale.t() if rowwise else w_scale  # (1, N) per output column, or one
    # What the micro-pipeline pass builds for reshape -> _scaled_mm -> reshape -> reduce_scatter(dim 1).
    args = dict(orig_scatter_dim=1, scatter_dim_after_maybe_reshape=0, output_shape=[case.batch, S, N])

    if case.via == "symm_mem":
        symm_mem.enable_symm_mem_for_group(group.group_name)
        out = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
            a_fp8, w_fp8.t(), a_scale, b_scale, "sum", args["orig_scatter_dim"],
            args["scatter_dim_after_maybe_reshape"], group.group_name, args["output_shape"],
            None, None, torch.bfloat16, False)
    else:
        original = symm_mem._pipelined_produce_and_all2all
        symm_mem._pipelined_produce_and_all2all = _emulated_all2all
        try:
            out = symm_mem._fused_scaled_matmul_reduce_scatter_impl(
                mm_out_op=torch.ops.aten._scaled_mm.out, A=a_fp8, B=w_fp8.t(), A_scale=a_scale,
                kwargs={"scale_b": b_scale, "bias": None, "scale_result": None, "out_dtype": torch.bfloat16,
                        "use_fast_accum": False},
                out_dtype=torch.bfloat16, reduce_op="sum", group_name=group.group_name,
                **{**args, "output_shape": list(args["output_shape"])})  # the impl shrinks it in place
        finally:
            symm_mem._pipelined_produce_and_all2all = original

    partial = (a_fp8.float() * a_scale) @ (w_fp8.float() * w_scale).t()
    d.all_reduce(partial, group=group)
    expected = partial.reshape(case.batch, S, N).chunk(dist.world_size, dim=1)[dist.rank]
    assert tuple(out.shape) == tuple(expected.shape), f"output shape {tuple(out.shape)}, expected {tuple(expected.shape)}"
    db = _sqnr(expected, out.float())
    if db < MIN_SQNR_DB:
        batch_major = partial.reshape(-1, N).chunk(dist.world_size)[dist.rank].reshape(expected.shape)
        hint = (" - it equals the batch-major row chunk (rows mixed up across sequence positions)"
                if _sqnr(batch_major, out.float()) >= MIN_SQNR_DB else "")
        raise AssertionError(
            f"fused_scaled_matmul_reduce_scatter(A {tuple(a_fp8.shape)}, orig_scatter_dim=1, "
            f"scatter_dim_after_maybe_reshape=0, output_shape={args['output_shape']}) on rank {dist.rank}: "
            f"SQNR {db:.1f} dB against the reduce-scatter along the sequence (< {MIN_SQNR_DB:g} dB){hint}")
