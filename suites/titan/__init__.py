"""torchtitan's API lines, one small adapter each, chosen by feature checks.

torchtitan changes shape between releases (0.2.x: a `JobConfig` and
`parallelize_llama(model, parallel_dims, job_config)`; 0.3.x: keyword-only configs,
`Llama3Model`, sharding declared on the model). The suites say what they want in
torchtitan-neutral terms (a `Job`) and an adapter turns it into that line's calls.

`select()` tries each adapter's `probe()`: it imports what that line needs and checks
the signatures it will call, and says why not when they do not fit. Nothing here
imports torchtitan at module import, so collecting a suite never fails on a torchtitan
it does not know: a suite calls `select()` inside the test and skips with the reasons
(a new torchtitan shows up as a skip to adapt, never as a failure, never as a pass).
Version strings are reported, never used to choose.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

LINES = ("line02", "line03")  # modules of this package, oldest first


@dataclass(frozen=True)
class Job:
    """What a suite asks torchtitan to do with its llama3 debug model (TP only)."""

    n_layers: int
    seq_len: int
    tp: int
    compile: bool = False
    backend: str | None = None  # a registered Dynamo backend name; None: torchtitan's default
    ac: str = "none"  # none | full | selective
    float8: str = "none"  # none | tensorwise | rowwise
    float8_skip_fqns: tuple[str, ...] = ("output",)  # torchtitan skips converting its output projection
    async_tp: bool = False
    tie: bool = False  # the output projection tied to the token embedding (torchtitan's enable_weight_tying)


class Line(Protocol):
    """One torchtitan API line. `sharded` maps parameter-name suffixes to the TP shard dim."""

    name: str
    sharded: dict[str, int]

    def build_model(self, job: Job, device: Any, seed: int) -> Any: ...

    def vocab_size(self, model: Any) -> int: ...

    def forward(self, model: Any, tokens: Any) -> Any: ...

    def convert_float8(self, model: Any, job: Job) -> None: ...

    def parallelize(self, model: Any, job: Job, mesh: Any, world_size: int, device_type: str) -> Any: ...

    def loss_parallel(self, job: Job) -> bool: ...

    def enable_async_tp(self, mesh: Any) -> None: ...


class UnknownAPI(Exception):
    """No adapter fits the installed torchtitan; str() says what each one found missing."""


def version() -> str:
    try:
        from importlib.metadata import version as dist_version

        return dist_version("torchtitan")
    except Exception:
        return "?"


def select() -> Line:
    """The adapter for the installed torchtitan, or UnknownAPI with every line's reason."""
    reasons = []
    for name in LINES:
        module = importlib.import_module(f"{__name__}.{name}")
        why = module.probe()
        if not why:
            return module.LINE
        reasons.append(f"{module.LINE.name}: {why}")
    raise UnknownAPI(f"torchtitan {version()} matches no adapter this suite knows ({'; '.join(reasons)})")


def select_or_skip() -> Line:
    """select(), turned into pytest.skip with the reasons."""
    import pytest

    try:
        return select()
    except UnknownAPI as err:
        pytest.skip(str(err))
