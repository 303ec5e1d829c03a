"""A time bound on one op case: a case that spins in Python fails in seconds, naming where.

Why: DTensor's sharding propagation can loop forever in Python before any collective
(`dtensor-view-zero-dim-loops`: `view_groups` never returns for a reshape that merges a
0-long dim with the dims after it), so no process-group timeout fires, and only the sweep's
watchdog (ops_sweep.CASE_LIMIT_S, 300 s) ended it, with the slot: one such case cost a sweep
five minutes and the cases its slot had left. Under the bound the case raises `CaseTimeout`
in the rank's main thread (an interval timer, SIGALRM: Python runs the handler between
bytecodes, so a Python loop stops wherever it is). A rank blocked in C (a collective) is not
interrupted: its peers' side-group timeout and the watchdog stay in charge of that.

How long (`bound_s`): BASE_S times the machine's contention, plus what the case's sizes need.
Measured over the day's sweeps (3,594 case rows, torch 2.13.0 and 2.15.0, docs/benchmarks.md):
on idle cores the slowest case took 1.2 s (the first of a slot: lazy imports); at load 10-15
on 2 cores 99.9 % took under 7.5 s and the slowest 10.5 s. A rank's share of a core falls
with the load, so the bound grows with the load per core (at least 1, at most LOAD_CAP): 10 s
idle (8x the slowest), 40 s at load 8 or more on 2 cores (4x the slowest seen there). Longer
took only sdpa's decomposition propagation (fixes off, 30 to 850 s, known issue
`dtensor-sdpa-cpu-sharding-propagation-time`): a stall a trainer meets too, cut like a loop.
Drawn sizes are at most 16 a dim, where the size term is milliseconds; a case written by
hand may be large, and gets WORK_PER_S's time for its work on top.

Where (`BoundHit.where`): once the bound passes, the timer samples the stack SAMPLES times,
SAMPLE_S apart, then raises. `where` is the innermost function every sample shares (the loop
itself, not a helper it happens to be in), preferring DTensor's own code (torch/distributed),
then torch's, then any (a planted spin). The signature carries no number (the bound moves with
the load; stored signatures turn numbers into N anyway), so one loop is one find across cases,
ops and nights: `the case did not return within its time bound (sharding propagation looping
in view_groups)`, which the known-issues entry matches as it matches its repro's line.

Stdlib only: this runs in cell environments.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Iterator, Sequence

BASE_S = 10.0
"""The bound on idle cores: 8x the slowest case measured there (1.2 s)."""
LOAD_CAP = 4.0
"""The most the load scales the bound: 40 s, 4x the slowest case seen at load 10-15 on 2 cores."""
WORK_PER_S = 2e7
"""Element-work (a case's input elements times its largest dim, a matmul's order) per second
allowed on top: a few passes of the reference, the DTensor op, its gathers and the compare."""
SAMPLES = 8
SAMPLE_S = 0.01
"""Stack samples taken once the bound passed, this far apart (80 ms in all)."""
AGAIN_S = 0.5
"""After the raise, it is raised again this often until the bound is left: code that swallows
a BaseException must not keep the case spinning."""
PROPAGATION = "torch/distributed/tensor/_sharding_prop.py"


class CaseTimeout(BaseException):
    """The case ran past its bound. A BaseException on purpose: DTensor's dispatch wraps every
    Exception ("Sharding propagation failed") and the judge reads an Exception of the full op
    as an invalid draw; this one passes both and reaches the case's runner, which catches it."""


@dataclass(frozen=True)
class BoundHit:
    """Where a case was when its bound passed."""

    bound_s: float
    where: str
    """The innermost function every sample shared (see the module docstring)."""
    propagation: bool
    """DTensor's sharding propagation is on the stack (the frames every sample shared)."""
    frames: tuple[str, ...]
    """The last sample, innermost first: 'torch/...py:LINE function'."""

    @property
    def signature(self) -> str:
        what = "sharding propagation looping" if self.propagation else "looping"
        return f"the case did not return within its time bound ({what} in {self.where})"

    def describe(self) -> str:
        return (f"its bound was {self.bound_s:.1f} s (BASE_S {BASE_S:.0f} s x the load per core, plus its sizes' "
                f"work: suites/generators/case_bound.py); innermost frames when it passed:\n"
                + "\n".join(f"    {f}" for f in self.frames))


def contention() -> float:
    """The 1-minute load per core this process may use, at least 1, at most LOAD_CAP."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return 1.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(LOAD_CAP, max(1.0, load / max(1, cores)))


def bound_s(shapes: Sequence[Sequence[int]], load: float | None = None, base_s: float = BASE_S) -> float:
    """The bound of a case whose inputs have `shapes`; `load`: the contention (default: now);
    `base_s`: the idle bound (a batch may lower it: tests/test_fuzz_ops.py's spinning cases
    cost it each, times the load, while the cases that pass take milliseconds)."""
    numel = sum(_prod(s) for s in shapes)
    widest = max((max(s) for s in shapes if len(s)), default=1)
    return base_s * (contention() if load is None else load) + numel * widest / WORK_PER_S


class Bound:
    """`with Bound(seconds) as b:` raises CaseTimeout in this thread once `seconds` pass, with
    `b.hit` saying where. Off the main thread, or while someone else's timer is set, it bounds
    nothing (`armed` False): the sweep's watchdog still holds."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.armed = False
        self.hit: BoundHit | None = None
        self.started = 0.0
        self._samples: list[list[tuple[str, int, str]]] = []
        self._left = False
        self._sampling = False
        self._previous = None

    def __enter__(self) -> "Bound":
        self.started = time.monotonic()
        free = hasattr(signal, "setitimer") and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        if free and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGALRM, self._tick)
            signal.setitimer(signal.ITIMER_REAL, self.seconds, SAMPLE_S)
            self.armed = True
        return self

    def __exit__(self, *exc: object) -> bool:
        if self.armed:
            self._left = True  # a tick already delivered but not yet handled does nothing
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
        return False

    @contextmanager
    def paused(self) -> Iterator[None]:
        """A wait on the other ranks (the op case's raised-anywhere agreement) is not the case's
        time: the timer stops inside and restarts with what was left. A peer that never comes
        is the side group's timeout's to tell, not a spin of this rank's."""
        if not self.armed or self._left or self.hit is not None:
            yield
            return
        left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        began = time.monotonic()
        try:
            yield
        finally:
            self.started += time.monotonic() - began
            signal.setitimer(signal.ITIMER_REAL, max(left, SAMPLE_S), SAMPLE_S)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _tick(self, signum: int, frame: FrameType | None) -> None:
        if self._left or self._sampling:  # left, or a tick that came while the last one sampled
            return
        if self.hit is None:
            self._sampling = True
            try:
                self._samples.append(_stack(frame))
            finally:
                self._sampling = False
            if len(self._samples) < SAMPLES:
                return
            self.hit = _hit(self._samples, self.seconds)
            signal.setitimer(signal.ITIMER_REAL, AGAIN_S, AGAIN_S)
        raise CaseTimeout(self.hit.signature)


def _stack(frame: FrameType | None) -> list[tuple[str, int, str]]:
    """(file, line, function), outermost first, without this module's own frames."""
    out = []
    while frame is not None:
        if frame.f_code.co_filename != __file__:
            out.append((frame.f_code.co_filename.replace(os.sep, "/"), frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out[::-1]


def _hit(samples: list[list[tuple[str, int, str]]], seconds: float) -> BoundHit:
    shared = []  # the frames (file, function) every sample has at the same depth, outermost first
    for depth in range(min(len(s) for s in samples)):
        keys = {(s[depth][0], s[depth][2]) for s in samples}
        if len(keys) > 1:
            break
        shared.append(samples[-1][depth])
    where = (next((f for f in reversed(shared) if _short(f[0]).startswith("torch/distributed/")), None)
             or next((f for f in reversed(shared) if _short(f[0]).startswith("torch/")), None)
             or (shared[-1] if shared else samples[-1][-1]))
    last = samples[-1][::-1]
    return BoundHit(seconds, where[2], any(_short(f[0]) == PROPAGATION for f in shared),
                    tuple(f"{_short(f[0])}:{f[1]} {f[2]}" for f in last[:10]))


def _short(path: str) -> str:
    """The path from its package down (torch/..., suites/...), without the machine's directories:
    after the last site-packages/, else after the last /torch/ or /suites/ (a source checkout)."""
    for root in ("/site-packages/", "/dist-packages/"):
        if root in path:
            return path.rsplit(root, 1)[1]
    for root in ("/torch/", "/suites/"):
        if root in path:
            return root[1:] + path.rsplit(root, 1)[1]
    return path.rsplit("/", 1)[-1]


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
