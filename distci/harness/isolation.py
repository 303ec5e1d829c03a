"""Per-test isolation: what is left to do once every test runs in a fresh fork.

Each test runs in a new fork of its rank worker (template.py), which never runs a test
itself: Dynamo's caches, configs, DTensor's sharding caches, process-wide torch and Python
settings, patched functions, modes, threads, handlers and limits all start as the template
has them, so none is listed or restored here. What stays per test is the seed: a fork
inherits the template's RNG state, and a test's random numbers must not depend on which
tests ran before it or on the pool's age.
"""

from __future__ import annotations

import random


def reseed(seed: int) -> None:
    """Python's, torch's and (where installed) numpy's global generators, seeded with `seed`."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
