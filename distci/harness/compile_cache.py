"""Where a run's ranks keep inductor's on-disk caches (FX graph, AOTAutograd, Triton, C++ kernels).

Every test runs in a fresh fork (template.py), so Dynamo's and inductor's in-memory caches die
with it; the on-disk caches are what lets test N+1 reuse what test N compiled. They live in one
directory per stack and fixes mode: inside the cell's environment (a venv: a stack has one, and
the directory goes when the environment does), so a stack's nightly runs reuse each other's
kernels, and never a directory shared with other stacks or other runs' fix selections (the
fixes patch torch at run time, which inductor's cache key cannot see: a fix_off cell must not
hit a graph a fix_on cell compiled). A Python that is not a venv (a preinstalled stack) gets
one directory per run instead, removed with the run's scratch. A TORCHINDUCTOR_CACHE_DIR the
caller set (the compiler bisect's private one, a user's) is left as it is.

Triton's cache follows inductor's (torch puts it under this directory when TRITON_CACHE_DIR is
unset). suites/evidence.py keeps the post-grad evidence whole when a graph comes from the cache.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
IN_ENV = Path("var") / "distci-compile-cache"
"""Where, inside a cell's venv, its stack's caches live (one folder per fixes mode)."""
LEARNED_RECORD = "learned-imports.json"
KEYED_CACHES = ("fxgraph", "aotautograd")
"""The caches whose entries are whole compiled graphs: a warm run that writes one compiled again."""


def compile_cache_dir(run_dir: Path, fixes: str | None = None) -> Path:
    """The inductor cache directory of this interpreter's stack and `fixes` mode
    ($DISTCI_FIXES, default all), or `run_dir`/compile-cache where there is no venv to hold it."""
    fixes = os.environ.get("DISTCI_FIXES", "all") if fixes is None else fixes
    if sys.prefix != sys.base_prefix and os.access(sys.prefix, os.W_OK):
        mode = hashlib.sha256(fixes.encode()).hexdigest()[:12]
        return Path(sys.prefix) / IN_ENV / f"fixes-{mode}"
    return Path(run_dir) / "compile-cache"


def compile_cache_env(run_dir: Path) -> dict[str, str]:
    """The environment entries that point the ranks at the stack's cache and at the stack's
    record of what tests import lazily (warm.py: where their templates remember it across
    sessions); none for either the caller chose itself."""
    from distci.harness.warm import RECORD_ENV

    here = compile_cache_dir(run_dir)
    chosen = {CACHE_ENV: str(here), RECORD_ENV: str(here / LEARNED_RECORD)}
    return {name: value for name, value in chosen.items() if not os.environ.get(name)}


def graph_entries(env_root: Path) -> dict[str, int]:
    """How many FX graph and AOTAutograd entries the cell envs under `env_root` hold, per cache:
    the difference across a run is what it compiled instead of reusing."""
    counts = dict.fromkeys(KEYED_CACHES, 0)
    for cache in KEYED_CACHES:
        for folder in Path(env_root).glob(f"*/{IN_ENV}/*/{cache}"):
            counts[cache] += sum(1 for entry in folder.rglob("*") if entry.is_file())
    return counts
