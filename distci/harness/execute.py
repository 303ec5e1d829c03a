"""Runs one test function on one rank and turns what happened into a RankReport.

Shared by the pool worker and the torchrun entry so both classify failures the same way.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
import traceback
from typing import Callable

from distci.harness.context import DistContext
from distci.harness.protocol import RankReport, TestRequest


def prepare_path(request: TestRequest) -> None:
    """Puts the controller's sys.path entries this process lacks in front, as pytest had them."""
    for entry in reversed(request.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def load_function(request: TestRequest):
    prepare_path(request)
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


def describe(exc: BaseException) -> str:
    """str(exc), or what can be said when its __str__ raises: the test still failed with
    `exc`, and the rank must report that rather than die of it."""
    try:
        return str(exc)
    except BaseException as inner:  # noqa: BLE001 - any __str__ may raise anything
        return f"<{type(exc).__qualname__} whose str() raised {type(inner).__qualname__}>"


def _format_traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:  # noqa: BLE001 - as describe(): the frames, without the message
        return "".join(traceback.format_tb(exc.__traceback__)) + f"{type(exc).__qualname__}: {describe(exc)}\n"


def execute(request: TestRequest, ctx: DistContext,
            before_call: Callable[[], None] | None = None) -> RankReport:
    """Runs the test. `before_call` runs once its module is imported, just before the body:
    the leak snapshot is taken there, so what an import does once is no test's doing.

    Whatever the body raises is its failure, KeyboardInterrupt and SystemExit included
    (a rank never needs them to stop: the controller kills it)."""
    start = time.monotonic()
    try:
        fn = load_function(request)
        kwargs = dict(request.kwargs)
        if "dist" in inspect.signature(fn).parameters:
            kwargs["dist"] = ctx
        if before_call is not None:
            before_call()
        fn(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure of the test is reported
        duration = time.monotonic() - start
        if _is_skip(exc):
            return RankReport(ctx.rank, "skipped", message=describe(getattr(exc, "msg", exc)), duration_s=duration)
        kind = "assert" if isinstance(exc, AssertionError) else "exception"
        return RankReport(
            ctx.rank,
            "failed",
            kind=kind,
            exc_type=f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
            message=describe(exc),
            traceback=_format_traceback(exc),
            duration_s=duration,
        )
    return RankReport(ctx.rank, "passed", duration_s=time.monotonic() - start)
