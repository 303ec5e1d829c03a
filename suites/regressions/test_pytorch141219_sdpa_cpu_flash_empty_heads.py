"""sdpa's CPU flash kernel dies with SIGFPE on zero heads or zero queries (a crash, not an error).

Trigger: `aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)` with q, k, v of zero heads
(B, 0, L, E), or zero query length (B, H, 0, E). Plain `F.scaled_dot_product_attention` never
calls the kernel on an empty input (its early return, pytorch PR #175063), but DTensor calls it
on each rank's local shards: a heads-sharded attention whose heads do not fill every rank (5
heads over 4 ranks: 2, 2, 1, 0) kills the rank holding none, and the others hang in the next
collective. An empty batch (0, H, L, E) returns normally: the control. Found fixes on by the
ops generator (seed sdpafix, torch 2.13.0 CPU, 2026-12-06) as
`sdpa~4~f32~5x5x3x7,5x5x16x7,5x5x16x7~Pavg,Pavg,Psum~is_causal=0~248` and
`sdpa~4~bf16~8x5x11x12,8x5x5x12,8x5x5x12~S-1,S3,Psum~is_causal=1~313`: the first
dtensor_sdpa_cpu_strategy offered a heads split there (the fix now offers none that leaves a
rank empty). The kernel runs in a child process so the crash is an outcome, not a dead worker.
Measured on 2.13.0 and 2.15.0. Upstream: pytorch#141219 (the same crash through a direct call,
torch 2.5.0, closed), whose kernel still crashes here.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from ..conftest import tier_marks

pytestmark = tier_marks("nightly")

_CHILD = """
import sys, torch
b, h, l = (int(x) for x in sys.argv[1:4])
q, k, v = torch.randn(b, h, l, 8), torch.randn(b, h, 5, 8), torch.randn(b, h, 5, 8)
out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
assert out.shape == (b, h, l, 8), out.shape
"""


@pytest.mark.parametrize("shape", [(2, 0, 3), (2, 3, 0), (0, 3, 3)], ids=["zero_heads", "zero_queries", "empty_batch_control"])
def test_cpu_flash_kernel_returns_an_empty_output_for_an_empty_input(shape) -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD, *map(str, shape)], capture_output=True, text=True, timeout=120)
    died = -done.returncode if done.returncode < 0 else None
    assert done.returncode == 0, (
        f"the CPU flash kernel on q of shape (B, H, L) = {shape} "
        + (f"died with {signal.Signals(died).name}" if died else f"exited {done.returncode}: {done.stderr[-500:]}"))
