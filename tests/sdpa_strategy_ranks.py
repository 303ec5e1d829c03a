"""2 gloo ranks: sdpa on CPU DTensors with dtensor_sdpa_cpu_strategy applied, against full tensors.

Run by tests/test_fix_dtensor_sdpa_cpu.py (DISTCI_FIXES=none, so only this fix is in play).
Each case distributes q, k, v (and an attn_mask) with its placements, runs
F.scaled_dot_product_attention forward and backward, and compares the output and every input
gradient (full_tensor()) with the same calls on the full tensors; rank 0 prints
"<mode>: N cases agree", or each case that differs, and the run exits 0 or 1.

The modes, in the order given on the command line (default: `right`): `right` runs the fix
as it is; `wrong` plants a wrong strategy first (heads-sharded outputs declared replicated),
which this check must catch (SDPA_STRATEGY_MUTATE=1 alone means `wrong`). Each mode's two
ranks are forked from this process, which imported torch and DTensor once for all of them
(and ran no op: nothing a fork could inherit half-done), so a mode costs its cases, not two
interpreters' imports; its ranks start with the fix unapplied and apply it themselves, and
the parent prints "<mode>: exit N" once they ended. The process exits 0 when every mode did.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.tensor  # noqa: F401 - imported once here, for every forked rank
import torch.multiprocessing as mp
import torch.nn.functional as F

WORLD = 2
# (q, k, v placements, mask placement or None, dtype, is_causal, scale, B, H, L, S, E)
CASES = [
    ("S1", "S1", "S1", None, "f32", False, None, 3, 5, 7, 9, 4),  # TP's heads: 5 heads on 2 ranks
    ("S1", "S1", "S1", None, "bf16", True, None, 2, 4, 9, 11, 8),
    ("S0", "S0", "S0", None, "f32", False, 0.5, 3, 2, 5, 5, 4),  # batch 3 on 2 ranks
    ("S0", "S0", "S0", "S0", "f32", False, None, 4, 3, 5, 6, 4),  # a batch-sharded (B, 1, L, S) mask
    ("S1", "S1", "S1", "R", "bf16", False, 0.3, 2, 4, 5, 7, 4),  # a replicated mask with heads sharding
    ("R", "S1", "Psum", None, "bf16", False, None, 7, 5, 9, 11, 7),  # the generator's 104 s case
    ("S2", "R", "R", None, "f32", True, None, 2, 3, 7, 7, 4),  # the query's sequence
    ("R", "S2", "S2", None, "f32", False, None, 2, 3, 5, 9, 4),  # the keys' sequence
    ("R", "R", "S3", None, "f32", False, None, 1, 13, 11, 4, 7),  # v's head dim (a known issue, fixes off)
    ("S3", "S3", "R", None, "bf16", False, None, 2, 2, 3, 3, 6),
    ("Pavg", "R", "S0", None, "f32", True, None, 3, 2, 4, 4, 4),
    ("S1", "S1", "S1", "S0", "f32", False, None, 2, 4, 5, 5, 4),  # mask S0 while q is heads-sharded
    ("S1", "S0", "R", None, "f32", False, None, 2, 4, 3, 3, 2),  # mixed layouts
    ("S1", "S1", "Psum", None, "f32", False, None, 3, 1, 3, 5, 4),  # 1 head: a heads split leaves a rank none
]
TOL = {"f32": dict(atol=2e-5, rtol=2e-5), "bf16": dict(atol=3e-2, rtol=3e-2)}


def _placement(text: str):
    from torch.distributed.tensor import Partial, Replicate, Shard

    if text == "R":
        return Replicate()
    if text.startswith("P"):
        return Partial(text[1:])
    return Shard(int(text[1:]))


def _distribute(full: torch.Tensor, text: str, mesh) -> torch.Tensor:
    """A DTensor whose full_tensor() is `full`: a Partial one holds a split of it per rank."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if text.startswith("P"):
        rank = dist.get_rank()
        if text == "Psum":
            local = full * (0.25 if rank == 0 else 0.75)
        else:  # Pavg: the mean of the ranks' values
            local = full * (0.5 if rank == 0 else 1.5)
        return DTensor.from_local(local, mesh, [_placement(text)], run_check=False)
    return distribute_tensor(full, mesh, [_placement(text)])


def _plant_wrong_strategy() -> None:
    from distci_fixes.fixes import dtensor_sdpa_cpu_strategy as fix

    right = fix._placements

    def wrong(op_schema, tensors, replicate, shard):
        out = right(op_schema, tensors, replicate, shard)
        heads = out[1]
        outputs = 2 if tensors == 5 else 3
        heads[:outputs] = [replicate()] * outputs
        return out

    fix._placements = wrong


def _case(mesh, case, index: int) -> list[str]:
    from torch.distributed.tensor import DTensor

    qp, kp, vp, mp_, dtype_name, causal, scale, b, h, l, s, e = case
    dtype = torch.float32 if dtype_name == "f32" else torch.bfloat16
    g = torch.Generator().manual_seed(index)
    q, k, v = (torch.randn(*shape, generator=g).to(dtype) for shape in ((b, h, l, e), (b, h, s, e), (b, h, s, e)))
    mask = torch.randn(b, 1, l, s, generator=g).to(dtype) if mp_ else None
    cot = torch.randn(b, h, l, e, generator=g).to(dtype)
    kw = {"is_causal": causal, "scale": scale}

    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, attn_mask=mask, **kw)
    ref.backward(cot)

    ins = [_distribute(t, p, mesh).detach().requires_grad_() for t, p in zip((q, k, v), (qp, kp, vp))]
    dmask = _distribute(mask, mp_, mesh) if mask is not None else None
    out = F.scaled_dot_product_attention(*ins, attn_mask=dmask, **kw)
    out.backward(_distribute(cot, "R", mesh).redistribute(mesh, out.placements))
    problems = []
    name = f"case {index} {case}"
    for what, got, want in [("output", out, ref)] + [(f"grad {n}", i.grad, f.grad)
                                                     for n, i, f in zip("qkv", ins, full)]:
        got = got.full_tensor() if isinstance(got, DTensor) else got
        if got.shape != want.shape:
            problems.append(f"{name}: {what} shape {tuple(got.shape)} differs from {tuple(want.shape)}")
            continue
        try:
            torch.testing.assert_close(got.float(), want.float(), **TOL[dtype_name])
        except AssertionError as err:
            problems.append(f"{name}: {what} differs: {str(err).splitlines()[1:3]}")
    return problems


def _rank(rank: int, init_file: str, mode: str) -> None:
    # A planted wrong strategy can leave one rank in a collective: time out, do not hang.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    import torch.distributed.tensor._ops as ops_module
    from torch.distributed.device_mesh import init_device_mesh

    from distci_fixes.fixes import dtensor_sdpa_cpu_strategy as fix

    if mode == "wrong":
        _plant_wrong_strategy()
    assert fix.detect(ops_module), "the CPU flash kernel already has a strategy in this torch: nothing to test"
    fix.apply(ops_module)
    mesh = init_device_mesh("cpu", (WORLD,))
    problems = []
    for index, case in enumerate(CASES):
        try:
            problems += _case(mesh, case, index)
        except Exception as err:  # a wrong strategy can also make the local kernel raise
            problems.append(f"case {index} {case}: raised, the shape differs: {type(err).__name__}: {err}")
    if rank == 0:
        print("\n".join(f"{mode}: {p}" for p in problems) if problems else f"{mode}: {len(CASES)} cases agree",
              flush=True)
    dist.destroy_process_group()
    if problems:
        sys.exit(1)


def _run(mode: str) -> int:
    """One mode on WORLD ranks forked from this process: 0 when every rank exited 0."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.start_processes(_rank, args=(os.path.join(tmp, "init"), mode), nprocs=WORLD, start_method="fork")
        except mp.ProcessExitedException:
            return 1
        except Exception as err:
            print(f"{mode}: a rank failed: {err}", flush=True)
            return 1
    return 0


def main(argv: list[str]) -> int:
    modes = argv or (["wrong"] if os.environ.get("SDPA_STRATEGY_MUTATE") == "1" else ["right"])
    unknown = sorted(set(modes) - {"right", "wrong"})
    if unknown:
        print(f"unknown mode(s) {unknown}: give right and/or wrong", flush=True)
        return 2
    codes = []
    for mode in modes:
        codes.append(_run(mode))
        print(f"{mode}: exit {codes[-1]}", flush=True)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
