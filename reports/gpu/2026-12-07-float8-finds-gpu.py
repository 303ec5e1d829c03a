"""Today's three float8 finds (issue 40, programs generator, CPU with emulated float8) checked
on real float8 hardware: one GPU, one rank (NCCL), torchao's float8 matmuls not emulated.

Each check prints one line: the case, its control, and what was measured. Run:
    pip install --no-index --find-links .whl torchao && python3 reports/gpu/2026-12-07-float8-finds-gpu.py
"""
import copy
import os

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29555")
dist.init_process_group("nccl", rank=0, world_size=1)
torch.cuda.set_device(0)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import torchao  # noqa: E402
from torchao.float8 import (Float8LinearConfig, convert_to_float8_training,  # noqa: E402
                            precompute_float8_dynamic_scale_for_fsdp)

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:
    from torch.distributed._composable.fsdp import fully_shard

mesh = init_device_mesh("cuda", (1,))
print(f"torch {torch.__version__}, torchao {torchao.__version__}, {torch.cuda.get_device_name(0)}")


def precomputed_scale_after_load(moment: str) -> str:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).cuda()
    convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))
    fresh = copy.deepcopy(model)
    for m in (model, fresh):
        fully_shard(m, mesh=mesh)
    saved = copy.deepcopy(get_model_state_dict(model))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    if moment != "never_precomputed_control":
        precompute_float8_dynamic_scale_for_fsdp(model)
    set_model_state_dict(model, saved)
    set_model_state_dict(fresh, saved)
    if moment == "precomputed_again_control":
        precompute_float8_dynamic_scale_for_fsdp(model)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).cuda()
    out, expected = model(x), fresh(x)
    diff = float((out - expected).abs().max())
    return f"{'FAIL' if diff else 'ok  '} precomputed scale after load [{moment}]: output {diff:.3g} off (of {float(expected.abs().max()):.3g})"


def tp_styles_bias_grad(bias: bool) -> str:
    from torch.distributed.tensor.parallel import parallelize_module
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=bias), torch.nn.Linear(64, 32, bias=bias)).cuda()
    convert_to_float8_training(ref, config=Float8LinearConfig())
    tp = copy.deepcopy(ref)
    parallelize_module(tp, mesh, {"0": Float8ColwiseParallel(), "1": Float8RowwiseParallel()})
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).cuda()
    for m in (ref, tp):
        m(x).pow(2).sum().backward()
    worst = []
    for (name, p), q in zip(ref.named_parameters(), tp.parameters()):
        g = q.grad.full_tensor() if hasattr(q.grad, "full_tensor") else q.grad
        err = (g - p.grad).float().norm() / p.grad.float().norm().clamp_min(1e-30)
        sqnr = float(-20 * torch.log10(err.clamp_min(1e-30)))
        worst.append(f"{name} {sqnr:.0f} dB")
    return f"info tp styles bias={bias}: gradient SQNR of each parameter against the converted model: {', '.join(worst)}"


def fsdp_inference_mode() -> str:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).cuda()
    convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))
    fully_shard(model, mesh=mesh)
    x = torch.randn(16, 32).cuda()
    model(x).sum().backward()
    try:
        with torch.inference_mode():
            model(x)
    except Exception as exc:  # noqa: BLE001 - what it raises is the finding
        return f"FAIL fsdp2 float8 all-gather, inference_mode forward: {type(exc).__name__}: {str(exc)[:120]}"
    return "ok   fsdp2 float8 all-gather, inference_mode forward ran"


for moment in ("precomputed_before_load", "never_precomputed_control", "precomputed_again_control"):
    try:
        print(precomputed_scale_after_load(moment), flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"RAISED precomputed scale after load [{moment}]: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
for bias in (True, False):
    try:
        print(tp_styles_bias_grad(bias), flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"RAISED tp styles bias={bias}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
print(fsdp_inference_mode(), flush=True)
dist.destroy_process_group()
