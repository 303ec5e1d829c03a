"""One-off: Float8 linear gradients, inductor vs eager, float32 (cuda).

Usage: PYTHONPATH=<site>:. python3 tools/diag_f8_compile.py (1 GPU). Gradient SQNR of a
Float8 MLP compiled with inductor against eager, with and without
torch._inductor.config.emulate_precision_casts.
"""
import copy, math, torch
import torch._inductor.config as ic
from torchao.float8 import Float8LinearConfig, convert_to_float8_training

def sq(r, g):
    n = (r - g).pow(2).sum().item(); return math.inf if n == 0 else 10 * math.log10(r.pow(2).sum().item() / n)

for recipe in ("tensorwise", "rowwise"):
    for emulate in (False, True):
        torch._dynamo.reset(); ic.emulate_precision_casts = emulate; torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(256, 512, bias=False), torch.nn.SiLU(), torch.nn.Linear(512, 256, bias=False)).cuda()
        convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(recipe))
        c = copy.deepcopy(m); cc = torch.compile(c)
        x = torch.randn(4, 64, 256, device="cuda")
        m(x).square().mean().backward(); cc(x).square().mean().backward()
        print(recipe, "emulate_precision_casts" if emulate else "default", "grad SQNR inductor vs eager:",
              [round(sq(a.grad, b.grad), 1) for a, b in zip(m.parameters(), c.parameters())], flush=True)
