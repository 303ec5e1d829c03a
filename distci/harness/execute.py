"""Runs one test function on one rank and turns what happened into a RankReport.

Shared by the pool worker and the torchrun entry so both classify failures the same way.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
import traceback

from distci.harness.context import DistContext
from distci.harness.protocol import RankReport, TestRequest


def load_function(request: TestRequest):
    for entry in reversed(request.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    module = importlib.import_module(request.module)
    target = module
    parts = request.qualname.split(".")
    for i, part in enumerate(parts):
        target = getattr(target, part)
        if inspect.isclass(target) and i < len(parts) - 1:
            target = target()
    return target


def _is_skip(exc: BaseException) -> bool:
    import pytest

    return isinstance(exc, pytest.skip.Exception)


def execute(request: TestRequest, ctx: DistContext) -> RankReport:
    start = time.monotonic()
    try:
        fn = load_function(request)
        kwargs = dict(request.kwargs)
        if "dist" in inspect.signature(fn).parameters:
            kwargs["dist"] = ctx
        fn(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure of the test is reported
        if isinstance(exc, KeyboardInterrupt):
            raise
        duration = time.monotonic() - start
        if _is_skip(exc):
            return RankReport(ctx.rank, "skipped", message=str(getattr(exc, "msg", exc)), duration_s=duration)
        kind = "assert" if isinstance(exc, AssertionError) else "exception"
        return RankReport(
            ctx.rank,
            "failed",
            kind=kind,
            exc_type=f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
            message=str(exc),
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            duration_s=duration,
        )
    return RankReport(ctx.rank, "passed", duration_s=time.monotonic() - start)
