"""Tier selection and device requirements for the suites.

Tiers: every scenario carries `tier_<name>` markers for its own tier and every later one
(a `pr` scenario also runs in `nightly` and `release`), so either of these selects a tier:

    DISTCI_TIER=pr python -m pytest -p distci.harness.plugin suites        (what `nox -s dist_tests` sets)
    python -m pytest -p distci.harness.plugin suites --distci-tier pr
    python -m pytest -p distci.harness.plugin suites -m tier_pr

Without a tier every test runs. A shard (`--distci-shard K/N`, or $DISTCI_SHARD, what
`distci run --shard` sets) keeps every N-th of the tier's tests from the K-th on, so N jobs
run one cell's tier side by side and together run all of it (distci.judge.coverage joins
them); the collected order groups like rows, so each shard gets its share of the costly ones.

Device requirements (CUDA for async TP, an SM for real
float8 kernels, float8 collectives that gloo lacks) are turned into the harness's
`requires_accelerator` / `requires_sm` markers or a skip with the reason, for the
accelerator this run uses; what the stack itself cannot do (torchao missing, CPU
`_scaled_mm` without rowwise scales, no differentiable all-to-all, ...) is probed by
suites/probes/capabilities.py, and the row skips with the probe's reason.
"""

from __future__ import annotations

import os

import pytest

from .probes import capabilities
from .scenario.record import TIERS, Scenario

TIER_ENV = "DISTCI_TIER"
SHARD_ENV = "DISTCI_SHARD"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--distci-tier", default=None, choices=TIERS,
                     help=f"run only this tier's tests (default: ${TIER_ENV}, else every test)")
    parser.addoption("--distci-shard", default=None, metavar="K/N",
                     help=f"run the K-th of N shares of the selected tests (default: ${SHARD_ENV}, else all)")


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"tier_{tier}: part of the `{tier}` tier (and of every later tier)")


def tier_marks(tier: str) -> list[pytest.MarkDecorator]:
    """The markers of a test first run in `tier`: that tier's and every later one's."""
    return [getattr(pytest.mark, f"tier_{t}") for t in TIERS[TIERS.index(tier):]]


def selected_tier(config: pytest.Config) -> str | None:
    tier = config.getoption("--distci-tier", default=None) or os.environ.get(TIER_ENV) or None
    if tier is not None and tier not in TIERS:
        raise pytest.UsageError(f"{TIER_ENV}={tier!r} is not a tier; known: {', '.join(TIERS)}")
    return tier


def selected_shard(config: pytest.Config) -> tuple[int, int] | None:
    """(K, N) of `--distci-shard K/N` (else $DISTCI_SHARD), or None: every test."""
    text = config.getoption("--distci-shard", default=None) or os.environ.get(SHARD_ENV) or None
    if text is None:
        return None
    try:
        from distci.rundir import parse_shard  # the one reader of K/N (the CLI and the gate use it)
    except ImportError:
        raise pytest.UsageError(f"a shard ({text!r}) needs distci installed beside the suites") from None
    try:
        return parse_shard(text)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _device_type(config: pytest.Config) -> str:
    try:
        from distci.harness.plugin import harness_of
    except ImportError:  # the suites collected without distci installed
        harness = None
    else:
        harness = harness_of(config)
    if harness is not None:
        return harness.device_type
    from .scenario.devices import detect_device_type

    return detect_device_type()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tier = selected_tier(config)
    if tier is not None:
        keep, drop = [], []
        for item in items:
            (keep if item.get_closest_marker(f"tier_{tier}") else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    shard = selected_shard(config)
    if shard is not None:
        k, n = shard
        drop = [item for i, item in enumerate(items) if i % n != k - 1]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = [item for i, item in enumerate(items) if i % n == k - 1]
    device_type = _device_type(config)
    for item in items:
        callspec = getattr(item, "callspec", None)
        scenario = callspec.params.get("scenario") if callspec else None
        if isinstance(scenario, Scenario):
            for why in capabilities.missing(scenario, device_type):
                item.add_marker(pytest.mark.skip(reason=why))
            for name, args, why in scenario.needs(device_type):
                if name == "skip":
                    item.add_marker(pytest.mark.skip(reason=why))
                else:
                    item.add_marker(getattr(pytest.mark, name)(*args, reason=why))
