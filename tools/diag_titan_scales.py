"""One-off: which Float8 scales differ between torchtitan TP=2 and TP=1 (tensorwise, eager).

Usage: PYTHONPATH=<site>:. python3 -m torch.distributed.run --standalone --nproc-per-node=2 tools/diag_titan_scales.py
(2 GPUs; torchtitan and torchao installed). Prints each _scaled_mm's tensorwise scales at
TP=1 and TP=2 for one step of torchtitan's llama3 debug model (eager), and each
gradient's SQNR. Evidence behind the float32 tensorwise tolerance in suites/scenario/table.py.
"""
import copy, math, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from suites import test_torchtitan as T

CALLS = []
_orig = torch._scaled_mm


def _logged(a, b, *args, **kw):
    sa = kw.get("scale_a", args[0] if args else None); sb = kw.get("scale_b", args[1] if len(args) > 1 else None)
    CALLS.append((tuple(a.shape), tuple(b.shape), str(a.dtype)[-6:], str(b.dtype)[-6:],
                  float(sa.reshape(-1)[0]), float(sb.reshape(-1)[0])))
    return _orig(a, b, *args, **kw)


torch._scaled_mm = _logged

dist.init_process_group("nccl"); rank = dist.get_rank(); torch.cuda.set_device(rank)
dev = torch.device("cuda", rank); mesh = init_device_mesh("cuda", (2,))
from torchtitan.models.llama3 import parallelize_llama
from torchtitan.protocols.model_converter import build_model_converters
case = T.TitanCase(False, "none", "none", "tensorwise", False, "nightly")
model = T._model(dev); ref = copy.deepcopy(model)
jc = T._job_config(case, None); pd = T._parallel_dims(mesh, 2)
build_model_converters(jc, pd).convert(ref); build_model_converters(jc, pd).convert(model)
parallelize_llama(model, pd, jc)
T.STEPS = 1
logs = {}
for name, m, lp in (("tp1", ref, False), ("tp2", model, True)):
    CALLS.clear()
    rec = T._train(m, m, dev, loss_parallel=lp)
    logs[name] = (list(CALLS), rec)
if rank == 0:
    (c1, r1), (c2, r2) = logs["tp1"], logs["tp2"]
    print("loss", r1.losses, r2.losses, "calls", len(c1), len(c2))
    for i, (x, y) in enumerate(zip(c1, c2)):
        flag = "" if math.isclose(x[4], y[4], rel_tol=1e-6) and math.isclose(x[5], y[5], rel_tol=1e-6) else "  <-- scale differs"
        print(i, "tp1", x, "| tp2", y, flag)
    for k in r1.grads[0]:
        g1, g2 = r1.grads[0][k].float(), r2.grads[0][k].float()
        n = (g1 - g2).pow(2).sum().item(); s = g1.pow(2).sum().item()
        print("grad", k, "inf" if n == 0 else round(10 * math.log10(s / n), 1))
dist.destroy_process_group()
