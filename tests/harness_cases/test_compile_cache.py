"""Two identical compiled training steps in one run, each in its own fork of the rank template:
the second must take its graphs from the on-disk caches the first filled, and its post-grad
evidence (suites/evidence.py's inductor_probe) must equal the first's. Each rank writes what it
saw to $DISTCI_CASE_OUT; tests/test_compile_cache.py compares. Marked `compiles`: the rank
templates import inductor before they fork, so the test starts with it imported."""

import json
import os
import sys

import pytest


@pytest.mark.world_size(2)
@pytest.mark.compiles
@pytest.mark.parametrize("attempt", ["first", "second"])
def test_compiled_step(dist, attempt):
    compile_fx_ahead = "torch._inductor.compile_fx" in sys.modules
    import torch
    from torch._dynamo.utils import counters

    from suites.runner.evidence import Evidence, inductor_probe

    # A matmul alone: inductor calls the extern mm forward and backward, so a fresh cache builds
    # no C++ kernel (what the test is about is the FX graph and AOTAutograd caches' hit).
    def step(x, w):
        return x @ w

    torch.manual_seed(0)
    x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
    evidence = Evidence(compiled=True)
    with inductor_probe(evidence):
        out = torch.compile(step, backend="inductor")(x, w)
        out.backward(torch.ones_like(out))
    loss = out.sum()
    seen = {
        "graphs": evidence.post_grad_graphs,
        "ops": dict(evidence.post_grad_ops),
        "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
        "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
        "aot_hits": counters["aot_autograd"]["autograd_cache_hit"],
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "loss": float(loss),
        "compile_fx_ahead": compile_fx_ahead,
    }
    with open(os.path.join(os.environ["DISTCI_CASE_OUT"], f"{attempt}-rank{dist.rank}.json"), "w") as fh:
        json.dump(seen, fh)
