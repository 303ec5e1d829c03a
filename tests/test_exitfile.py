"""The exit file (distci.command): a CI step under nox (which exits 1 for every failure) still learns distci's code.

Through `python -m distci gate` on a real store: INCOMPLETE (3), a usage error (2), PASSED
(0); the noxfile's side (it fails the session and names the code) is tests/test_noxfile.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

from distci.command import write_exit_file
from distci.judge.store import Store


def read_exit_file(path: Path | str) -> dict | None:
    """The exit file's record as the workflows read it, or None when there is none (the command
    died before writing it) or it is not a whole record."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("exit_code"), int) else None

MATRIX = """\
schema = 1

[defaults]
python = "3.11"
world_size = 2
suites = ["suites"]
timeout = 300
tiers = ["release"]
fixes = "on"
torchao = "0.18.0"
torchtitan = "none"

[accelerators.cpu]
backend = "gloo"
runner = ["ubuntu-latest"]
archs = ["x86_64"]
variants = ["cpu"]

[[matrix]]
accelerator = "cpu"
torch = ["2.13.0"]

[tiers.release]
description = "Before a release."
blocking_suites = ["suites"]
"""


def _gate(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    exit_file = tmp_path / "exit.json"
    exit_file.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "distci", "gate", "--tier", "release", "--matrix",
                           str(tmp_path / "matrix.toml"), "--store", str(tmp_path / "store.sqlite"), *args],
                          cwd=REPO, env={**os.environ, "DISTCI_EXIT_FILE": str(exit_file)},
                          capture_output=True, text=True, timeout=120)
    return proc, read_exit_file(exit_file)


def test_gate_writes_incomplete_and_usage_errors_to_the_exit_file(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(MATRIX)
    Store(tmp_path / "store.sqlite").close()  # an empty store: the release cell never ran
    proc, written = _gate(tmp_path)
    assert proc.returncode == 3 and "gate INCOMPLETE" in proc.stdout, proc.stdout + proc.stderr
    assert written is not None and written["command"] == "gate" and written["exit_code"] == 3
    assert written["status"] == "INCOMPLETE" and written["meaning"].startswith("INCOMPLETE: ")
    assert written["incomplete"] == ["cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"]
    proc, written = _gate(tmp_path, "--waive", "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_oof", "--reason", "typo")
    assert proc.returncode == 2 and "did you mean" in proc.stderr
    assert written is not None and written["exit_code"] == 2 and written["command"] == "gate"
    proc, written = _gate(tmp_path, "--waive", "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on", "--reason", "no runner")
    assert proc.returncode == 0 and written is not None and written["exit_code"] == 0
    assert written["status"] == "PASSED"


def test_exit_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    target = tmp_path / "nox" / "distci-exit.json"
    assert write_exit_file("run", 3, "only infrastructure failed", target, runs=[]) == target
    assert json.loads(target.read_text()) == {"command": "run", "exit_code": 3, "meaning": "only infrastructure failed",
                                              "runs": []}
    assert not list(target.parent.glob("*.tmp"))
    assert write_exit_file("run", 0, "ok") is None or "DISTCI_EXIT_FILE" in os.environ
    target.write_text("{half")
    assert read_exit_file(target) is None and read_exit_file(tmp_path / "absent.json") is None
