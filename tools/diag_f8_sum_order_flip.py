"""Is a tp_f8 program's gradient difference a float8 rounding flip? (issue 40 triage, 2026-12-07)

Usage (2 ranks, gloo, from the checkout root):
    torchrun --nproc-per-node 2 tools/diag_f8_sum_order_flip.py WIDTH LAYERS

Builds the programs generator's model as `tp_f8-ws2-wWIDTH-lLAYERS-sgd:fwd_bwd` does (converted
to torchao float8 training, then Float8 TP styles), runs one forward and backward of batch 0 on
the TP model and on the single-process float8 reference, and prints, per block: how far the
activations and the gradients at its output differ (SQNR), whether their amax (the tensorwise
scale) agrees, and every element whose float8 cast differs (e4m3 forward, e5m2 backward) with
the two pre-cast values. A flip whose two values differ in the 7th digit and straddle a rounding
midpoint is fp32 sum order (TP's partial sums, all-reduced) moving a value across it: one e5m2
step (12-25 %) on one element, ~40-55 dB on every gradient downstream of it. Measured on torch
2.13.0 / torchao 0.18.0 and torch 2.11.0 / torchao 0.17.0 at WIDTH 32, LAYERS 2: block 1's output
gradient agrees to 139.7 dB with equal amax, and one element, -3328.0022 against -3327.9998 after
scaling (the e5m2 midpoint between 3072 and 3584 is 3328), rounds to -3584 in the reference and
-3072 under TP; LAYERS 3 and WIDTH 16 draw no flip and agree to >= 130 dB.
"""

import copy
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from suites.generators import programs
from suites.generators.program_layout import layout_model

E4M3_MAX, E5M2_MAX = 448.0, 57344.0


class _Dist:
    """The harness context layout_model asks for: the world's 1-D mesh."""

    world_size = 2

    def mesh(self, shape=None, names=None):
        return init_device_mesh("cpu", (self.world_size,))


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _sqnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(10 * torch.log10(a.pow(2).sum() / (a - b).pow(2).sum().clamp_min(1e-30)))


def _flips(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, top: float) -> list[str]:
    sa, sb = top / a.abs().max(), top / b.abs().max()
    ca, cb = (a * sa).to(dtype).float(), (b * sb).to(dtype).float()
    return [f"{tuple(k)}: {float(a[tuple(k)] * sa)!r} -> {float(ca[tuple(k)])} vs {float(b[tuple(k)] * sb)!r} -> "
            f"{float(cb[tuple(k)])}" for k in (ca != cb).nonzero().tolist()]


def main(width: int, layers: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = type("Spec", (), {"width": width, "layers": layers})()
    torch.manual_seed(programs.SEED)
    ref = programs.build(spec, "tp_f8", "cpu")
    run, _ = layout_model(copy.deepcopy(ref), "tp_f8", _Dist())
    seen: dict = {"ref": {}, "run": {}}
    for side, model in (("ref", ref), ("run", run)):
        for i, block in enumerate(model.blocks):
            block.register_forward_hook(lambda m, inp, out, s=side, i=i: seen[s].__setitem__(f"out{i}", _full(out)))
            block.register_full_backward_hook(
                lambda m, gin, gout, s=side, i=i: seen[s].__setitem__(f"grad{i}", _full(gout[0])))
    x, y = programs.batch(0, width, 1)
    for model in (ref, run):
        F.mse_loss(model(x), y).backward()
    grads = [(name, _sqnr(p.grad, _full(q.grad))) for (name, p), (_, q) in zip(ref.named_parameters(),
                                                                             run.named_parameters())]
    if rank == 0:
        for key in seen["ref"]:
            a, b = seen["ref"][key], seen["run"][key]
            fwd = key.startswith("out")
            flips = _flips(a, b, torch.float8_e4m3fn if fwd else torch.float8_e5m2, E4M3_MAX if fwd else E5M2_MAX)
            print(f"block {key[-1]} {'activation' if fwd else 'output gradient'}: {_sqnr(a, b):.1f} dB, amax "
                  f"{'equal' if a.abs().max() == b.abs().max() else 'differs'}, {len(flips)} float8 flip(s)")
            for flip in flips:
                print(f"    {flip}")
        for name, db in grads:
            print(f"grad {name}: {db:.1f} dB")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
