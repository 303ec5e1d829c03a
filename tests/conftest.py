"""Shared helpers for distci's own tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CASES = Path(__file__).parent / "harness_cases"

# The harness cases are distributed tests run by test_harness.py through the plugin;
# collected directly they would have no rank workers.
collect_ignore = ["harness_cases", "faults"]

SLOW_FIXTURES = {"mutated", "planted_run", "bounded_cases_run"}
"""Fixtures that start rank workers or build environments: a test that uses one is in the slow
tier whether or not it says so, so a new test over a shared slow fixture cannot land in the
quick tier by accident."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-report", type=Path, default=None,
                     help="write every test's CPU seconds (process tree) and wall time to this JSON file")


def pytest_configure(config: pytest.Config) -> None:
    from cpu_time import CpuTime  # tests/cpu_time.py: the per-file CPU and wall summary

    config.pluginmanager.register(CpuTime(config, config.getoption("--cpu-report")), "distci-tests-cpu-time")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile` as tests/workers.py spreads it (a file per worker, shared things on one
    worker, heaviest first); any other `--dist` is xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    from workers import make_scheduler

    return make_scheduler(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def run_pytest(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 600,
               cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Runs pytest with the distci plugin in a child process, as a cell run would."""
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH")]))
    from distci.run.cellrun import QUIET_PLUGINS  # as a cell's session: hypothesis's plugin left out

    cmd = [sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-q", *args]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def processes_with_env(token: str) -> list[int]:
    """PIDs whose environment holds DISTCI_TEST_TOKEN=token (our rank workers, if any live)."""
    found = []
    needle = f"DISTCI_TEST_TOKEN={token}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def token() -> str:
    import uuid

    return uuid.uuid4().hex
