"""A run stopped part-way still says how it ended: run.json's exit code is never null.

The stop is injected where a real one lands (Ctrl-C or SIGTERM, raised as
KeyboardInterrupt by the controller's signal handling) while the cell's environment is
being made; the slow tier's test_nox_stops.py stops a real run in pytest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from distci.matrix import load_matrix
from distci.run import cellrun
from distci.run.terminal import EXIT_INTERRUPTED


def test_a_run_stopped_while_provisioning_records_its_exit_code(tmp_path: Path, monkeypatch) -> None:
    cell = load_matrix(REPO / "matrix.toml").default_cell()

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(cellrun, "provision", stopped)
    with pytest.raises(KeyboardInterrupt):
        cellrun.run_cell(cell, runs_root=tmp_path, log=lambda line: None)
    (run_json,) = tmp_path.glob("*/run.json")
    info = json.loads(run_json.read_text())
    assert info["exit_code"] == EXIT_INTERRUPTED == 130 and info["ended_at"], info
