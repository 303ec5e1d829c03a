"""A tier in N shards: each job runs one share, the shares partition the tier's tests.

The join of the shards' runs into one complete run is tests/test_gate.py's
(test_shards_of_a_tier_join_into_one_complete_run); the Actions jobs per share are
tests/test_workflows.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from distci.cells import Cell
from distci.matrix import load_matrix
from distci.run.cellrun import QUIET_PLUGINS, pytest_command

REPO = Path(__file__).resolve().parents[1]


def test_the_cell_run_passes_its_share_to_pytest(tmp_path: Path) -> None:
    cell: Cell = load_matrix(REPO / "matrix.toml").select(tier="pr")[0]
    cmd = pytest_command(cell, Path(sys.executable), tmp_path, "r1", tests=[], keyword=None, extra_args=[],
                         shard="2/3")
    assert "--distci-shard=2/3" in cmd
    assert not any(a.startswith("--distci-shard") for a in pytest_command(
        cell, Path(sys.executable), tmp_path, "r1", tests=[], keyword=None, extra_args=[]))


def _collected(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS,
                           "--collect-only", "-q", f"--rootdir={REPO}", "suites", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "DISTCI_TIER": "nightly"})
    assert proc.returncode in (0, 4), proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line] if proc.returncode == 0 else [proc.stderr]


@pytest.mark.slow
def test_shards_partition_the_tier() -> None:
    pytest.importorskip("torch")
    whole = _collected()
    shares = [_collected(f"--distci-shard={k}/2") for k in (1, 2)]
    assert sorted(sum(shares, [])) == sorted(whole) and not set(shares[0]) & set(shares[1])
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
