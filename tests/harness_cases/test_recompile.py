"""Nine compile scenarios of one function; each must really compile (used by test_harness.py).

Each case changes a global the compiled function reads, so Dynamo must recompile the
same code object. Without the harness's reset between tests, the ninth case would hit
the recompile limit (8) and silently run eagerly: the counting backend would not run.
"""

import pytest

FACTOR = 0.0


def shared_step(x):
    return (x * FACTOR).sum()


@pytest.mark.world_size(2)
@pytest.mark.parametrize("n", range(1, 10))
def test_compiles(dist, n):
    import torch

    global FACTOR
    FACTOR = float(n)
    calls = []

    def counting_backend(gm, example_inputs):
        calls.append(len(gm.graph.nodes))
        return gm.forward

    compiled = torch.compile(shared_step, backend=counting_backend)
    out = compiled(torch.ones(4, device=dist.device))
    assert out.item() == 4.0 * n
    assert calls, f"case {n}: torch.compile fell back to eager (backend never ran)"
