"""Compute that a timeout sees as progress, at a tenth of a core.

A slow test (not a hung one) is told apart by its ranks' CPU time advancing while their
stacks are outside any collective (distci.harness.timeouts, procs.cpu_advancing over a 1 s
window). Spinning flat out proves that at a full core per rank for the whole budget, and
on a saturated runner the harness runs the case again with a budget up to 40 times longer:
minutes of CPU on a shared 2-core runner for one yes/no. Short bursts of pure-Python work
between sleeps advance the CPU time in every window just the same.
"""

import time

BURST_S = 0.01
PAUSE_S = 0.09


def compute_until(end: float) -> int:
    """Pure-Python work in bursts of BURST_S with PAUSE_S between them, until time.monotonic()
    passes `end`; returns the number of bursts."""
    bursts = 0
    while time.monotonic() < end:
        burst_end = time.monotonic() + BURST_S
        while time.monotonic() < burst_end:
            sum(i * i for i in range(1000))
        bursts += 1
        time.sleep(PAUSE_S)
    return bursts
