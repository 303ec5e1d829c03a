"""The core loop end to end: provision a real cell env, run a suite, record results."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

DEFAULT_CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"


def distci(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distci", *args], cwd=cwd, capture_output=True, text=True, timeout=1500
    )


def test_default_cell_runs_and_records_provenance(tmp_path):
    proc = distci(
        "run",
        "--cell",
        DEFAULT_CELL,
        "--runs-root",
        str(tmp_path),
        "--test",
        "tests/harness_cases/test_trivial.py::test_trivial[3]",
        "--test",
        "tests/harness_cases/test_basic.py::test_rank_assert",
    )
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "distci results" in proc.stdout and DEFAULT_CELL in proc.stdout
    (run_dir,) = tmp_path.iterdir()
    records = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert {r["test_id"].split("::")[-1]: r["outcome"] for r in records} == {
        "test_trivial[3]": "passed",
        "test_rank_assert": "failed",
    }
    for r in records:
        assert r["cell_id"] == DEFAULT_CELL
        assert r["stack"]["torch"].startswith("2.13.0")
        assert len(r["stack"]["torch_git"]) == 40
        assert r["stack"]["torchao"] == "0.18.0"
        assert r["stack"]["fixes_mode"] == "all"
    failed = next(r for r in records if r["outcome"] == "failed")
    assert failed["failure_kind"] == "assert"
    assert (
        failed["repro"]
        == f"nox -s dist_tests -- --cell {DEFAULT_CELL} --test tests/harness_cases/test_basic.py::test_rank_assert"
    )
    assert "repro:" in proc.stdout
    junit = ET.parse(run_dir / "junit.xml").getroot()
    assert junit.find("testsuite").get("failures") == "1"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["cell_id"] == DEFAULT_CELL and info["pytest_exit"] == 1 and info["ended_at"]


def test_unresolvable_cell_is_infra_not_failure(tmp_path):
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(
        'schema = 1\n[accelerators.cpu]\nbackend = "gloo"\nrunner = ["ubuntu-latest"]\n'
        'archs = ["x86_64"]\nvariants = ["cpu"]\n[tiers.pr]\n[[matrix]]\naccelerator = "cpu"\ntorch = "0.0.1"\ntorchao = "0.18.0"\ntiers = ["pr"]\n'
    )
    cell = DEFAULT_CELL.replace("torch_2.13.0", "torch_0.0.1")
    proc = distci("--matrix", str(matrix), "run", "--cell", cell, "--runs-root", str(tmp_path / "runs"))
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    (record,) = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert record["cell_id"] == cell
    assert record["outcome"] == "error" and record["failure_kind"] == "infra"
    assert record["stack"]["partial"] is True and record["stack"]["declared"]["torch"] == "0.0.1"
    assert "torch==0.0.1" in record["message"]


def test_matrix_json_is_an_actions_include_list():
    proc = distci("matrix", "--json", "--tier", "pr")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [e["cell"] for e in data["include"]] == [DEFAULT_CELL]


def test_bad_matrix_gives_one_line_error(tmp_path):
    matrix = tmp_path / "matrix.toml"
    matrix.write_text((REPO / "matrix.toml").read_text().replace("torchao =", "torchoa =", 1))
    proc = distci("--matrix", str(matrix), "matrix")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "torchoa" in lines[0] and "torchao" in lines[0], proc.stderr
