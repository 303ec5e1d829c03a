"""Running the fault cases (tests/faults/cases) through the harness and judging them from outside:
what tests/test_faults*.py share (and test_harness.py reads its runs with `read_results`).

The fault cases' tests are split over several files by the controller runs they share (a module
fixture each), so `--dist loadfile` spreads their waits (real hangs, timeouts, stops) over the
workers instead of one file running alone at the end of the run (docs/benchmarks.md, round 4).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from conftest import REPO
from distci.harness import procs
from distci.run.cellrun import QUIET_PLUGINS

CASES = Path(__file__).parent / "faults" / "cases"
LEFTOVER_LIMIT_S = 15.0


def fault_env(token: str, **extra: str) -> dict[str, str]:
    """This environment with the run token a leftover is found by, and the checkout on the path."""
    env = dict(os.environ, **extra)
    env[procs.RUN_TOKEN_ENV] = token
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def harness_cmd(run_dir: Path, *args: str) -> list[str]:
    """A pytest session under the harness writing its run to `run_dir` (the fault cases' cell)."""
    return [sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-q",
            f"--distci-run-dir={run_dir}", "--distci-cell=cpu-faults-ws2", *args]


def leftovers_after(token: str, limit_s: float = LEFTOVER_LIMIT_S, exclude: set[int] = frozenset()
                    ) -> tuple[list[int], float]:  # type: ignore[assignment]
    """Waits up to `limit_s` for every token-carrying process to go; (what is left, seconds waited)."""
    start = time.monotonic()
    spared = {os.getpid(), *exclude}
    left = procs.with_token(token, spared, prefix=True)
    while left and time.monotonic() - start < limit_s:
        time.sleep(0.1)
        left = procs.with_token(token, spared, prefix=True)
    return left, time.monotonic() - start


def read_results(run_dir: Path) -> dict[str, dict]:
    """The run's Results by test name (the part of the id after `::`)."""
    out = {}
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["test_id"].split("::", 1)[1]] = rec
    return out


def run_cases(tmp_path: Path, *args: str, timeout: float = 600, **env: str
              ) -> tuple[subprocess.CompletedProcess, dict, str]:
    """One controller over `args` to its end; asserts nothing of it is still running after."""
    token = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    proc = subprocess.run(harness_cmd(run_dir, *args), cwd=REPO, env=fault_env(token, **env), capture_output=True,
                          text=True, timeout=timeout)
    left, _ = leftovers_after(token)
    assert left == [], f"processes of the run still alive {LEFTOVER_LIMIT_S:.0f} s after it ended: {left}"
    return proc, read_results(run_dir), token


def outcome_of(rec: dict) -> tuple[str, str | None]:
    """A Result's outcome and failure kind."""
    return rec["outcome"], rec["failure_kind"]
