"""One-off: precision of the fused symm_mem Float8 ops vs their unfused math (torchrun, 2 GPUs).

Usage: PYTHONPATH=<site>:. [DISTCI_FIXES=none] python3 -m torch.distributed.run --standalone
--nproc-per-node=2 tools/diag_asynctp_ops.py (2 SM90 GPUs). Prints the SQNR of
symm_mem.fused_scaled_matmul_reduce_scatter (3-D A, and the 2-D A inductor passes) and
fused_all_gather_scaled_matmul against fp32 math, per scaling / out_dtype / fast accum.
"""
import math, torch, torch.distributed as dist
import torch.distributed._symmetric_memory as sm

def fp8(x, rowwise):
    amax = x.abs().amax(dim=-1, keepdim=True) if rowwise else x.abs().amax()
    scale = 448.0 / amax.float().clamp(min=1e-12)
    return (x.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.reciprocal()

def sqnr(r, g):
    n = (r - g.float()).pow(2).sum().item(); s = r.pow(2).sum().item()
    return math.inf if n == 0 else 10 * math.log10(s / n)

dist.init_process_group("nccl"); rank, ws = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(rank); dev = torch.device("cuda", rank); g = dist.group.WORLD
sm.enable_symm_mem_for_group(g.group_name)
B, S, K, N = 2, 64, 256, 512
torch.manual_seed(1 + rank)
for rowwise in (False, True):
    for od in ((torch.bfloat16,) if rowwise else (torch.float32, torch.bfloat16)):
        for fast in (False, True):
            tag = f"{'row' if rowwise else 'tensor'} out={str(od)[6:]} fast={fast}"
            # reduce-scatter: local A (B,S,K) @ W^T, sum over ranks, scatter along S
            a = torch.randn(B, S, K, device=dev); w = torch.randn(N, K, device=dev, generator=None)
            dist.broadcast(w, 0)
            af, asc = fp8(a.reshape(-1, K), rowwise); wf, wsc = fp8(w, rowwise)
            bsc = wsc.t() if rowwise else wsc
            part = (af.float() * asc) @ (wf.float() * wsc).t(); dist.all_reduce(part)
            exp = part.reshape(B, S, N).chunk(ws, dim=1)[rank]
            full = torch._scaled_mm(af, wf.t(), asc, bsc, out_dtype=od, use_fast_accum=fast).reshape(B, S, N).float()
            dist.all_reduce(full); unf_out = full.chunk(ws, dim=1)[rank]  # unfused: scaled_mm, then the reduce-scatter
            for form, A, Asc, after in (("3d", af.reshape(B, S, K), asc.reshape(B, S, -1) if rowwise else asc, 1),
                                        ("2d", af, asc, 0)):
                out = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(A, wf.t(), Asc, bsc, "sum", 1, after,
                        g.group_name, [B, S, N], None, None, od, fast)
                if rank == 0:
                    print(f"RS {tag} {form}: fused {sqnr(exp, out):.1f} dB, unfused {sqnr(exp, unf_out):.1f} dB")
            # all-gather: A shard (B,S/ws,K) gathered along S, @ W^T
            ash = torch.randn(B, S // ws, K, device=dev)
            asf, assc = fp8(ash.reshape(-1, K), rowwise)
            if not rowwise:  # tensorwise: one global scale, as torchao's DTensor amax gives
                amax = ash.abs().amax(); dist.all_reduce(amax, op=dist.ReduceOp.MAX)
                s = 448.0 / amax.float(); asf = (ash.reshape(-1, K) * s).clamp(-448, 448).to(torch.float8_e4m3fn); assc = s.reciprocal()
            full_a = [torch.empty_like(asf.reshape(B, S // ws, K).float()) for _ in range(ws)]
            dist.all_gather(full_a, (asf.float() * assc).reshape(B, S // ws, K))
            ref = torch.cat(full_a, dim=1) @ (wf.float() * wsc).t()
            a3 = asf.reshape(B, S // ws, K); s3 = assc.reshape(B, S // ws, 1) if rowwise else assc
            try:
                _, outs = torch.ops.symm_mem.fused_all_gather_scaled_matmul(a3, [wf.t()], s3, [bsc], 1, g.group_name,
                                                                            [None], [None], [od], [fast])
                if rank == 0:
                    print(f"AG {tag} gather_dim=1: fused {sqnr(ref, outs[0]):.1f} dB shape {tuple(outs[0].shape)}")
            except Exception as e:
                print(f"AG {tag}: {type(e).__name__}: {str(e)[:200]}")
dist.destroy_process_group()
