"""Test-id mode end to end, and --from-regression.

A wheelhouse holds four versions of a tiny package: 1.0 and 1.2 work, 1.1 cannot be
imported (a broken build), 1.3 breaks `add`. A distributed test (two gloo ranks, one
all_reduce) uses it. `distci bisect TEST_ID --good 1.0 --bad 1.3` installs each version
into a cached venv over a base holding torch, runs the test through the harness in
torchrun mode with this checkout's distci wheels on PYTHONPATH, and reads pytest's exit
codes: 0 good (1.0, 1.2), 1 bad (1.3), 2-5 skip (1.1: a collection error).

Then the same question comes from the store: a green run with 1.2 and a red run with
1.3 of the test make a `regression` verdict; `--from-regression` derives the axis, the
endpoints and the test from it, resumes the state of the first bisect (same question,
same state file: nothing runs again) and records the result in the store.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from fixtures_runs import write_run
from test_bisect_candidates import PACKAGE, write_wheel

from distci import cli
from distci.bisect.pins import Pins, load_stack
from distci.bisect.install import link_base_tree
from distci.bisect.regression import changed_axis, find_regression
from distci.bisect.state import BisectError
from distci.errors import ConfigError
from distci.judge.ingest import import_bisects, ingest_runs
from distci.judge.store import Store
from distci.stack import Stack

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _archive(tmp_path, monkeypatch):
    """Probes download into the wheelhouse archive: a test's own, not the checkout's."""
    monkeypatch.setenv("DISTCI_WHEELHOUSE_ROOT", str(tmp_path / "wheelhouse"))
    monkeypatch.setenv("DISTCI_ENV_ROOT", str(tmp_path / "envs"))


TEST_FILE = """\
import pytest
import torch
import torch.distributed as td

import distci_probe_demo as demo


@pytest.mark.world_size(2)
def test_sum_over_ranks(dist):
    total = torch.tensor([float(demo.add(dist.rank, 1))])
    td.all_reduce(total)
    assert total.item() == 3.0
"""
TEST_ID = "test_demo.py::test_sum_over_ranks"
SOURCES = {
    "1.0": "def add(a, b):\n    return a + b\n",
    "1.1": "raise ImportError('this build is broken')\n",
    "1.2": "def add(a, b):\n    return b + a\n",
    "1.3": "def add(a, b):\n    return a + b + 1\n",
}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("testid")
    house = root / "wheelhouse"
    house.mkdir()
    for version, source in SOURCES.items():
        write_wheel(house, version, source)
    (root / "work").mkdir()
    (root / "work" / TEST_FILE_NAME).write_text(TEST_FILE)
    return root


TEST_FILE_NAME = TEST_ID.split("::")[0]


def common(root: Path) -> list[str]:
    return ["--wheelhouse", str(root / "wheelhouse"), "--base-env", sys.prefix, "--cache", str(root / "cache"),
            "--out", str(root / "out"), "--timeout", "240", "--no-confirm"]


def test_a_test_id_is_bisected_through_the_harness_in_torchrun_mode(work, monkeypatch, capsys):
    monkeypatch.chdir(work / "work")
    markdown = work / "report.md"
    argv = ["bisect", TEST_ID, "--good", "1.0", "--bad", "1.3", "--axis", PACKAGE, *common(work),
            "--markdown", str(markdown)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"| 1 | verify | `{PACKAGE}==1.3` | bad |" in markdown.read_text()
    assert f"first bad: {PACKAGE}==1.3 (last good: {PACKAGE}==1.2)" in out
    report_path = Path(re.search(r"^report: (.+)$", out, re.MULTILINE).group(1))
    report = json.loads(report_path.read_text())
    outcomes = {p["candidate"].split("==")[1]: p["outcome"] for p in report["probes"]}
    assert outcomes == {"1.3": "bad", "1.0": "good", "1.1": "skip", "1.2": "good"}
    details = {p["candidate"].split("==")[1]: p["runs"][0]["detail"] for p in report["probes"]}
    # what the harness recorded comes first: the test, its outcome, the error
    assert details["1.3"].startswith(f"{TEST_ID}: failed\n") and "AssertionError" in details["1.3"]
    assert "\nexit 1\n" in details["1.3"] and "1 failed" in details["1.3"]
    assert re.search("^exit [24]\n", details["1.1"], re.M) and "this build is broken" in details["1.1"]
    assert details["1.2"].startswith(f"{TEST_ID}: passed\nexit 0\n") and "1 passed" in details["1.2"]
    assert "--distci-mode=torchrun" in report["meta"]["check"]
    assert (report_path.parent / "harness" / "logs" / "torchrun.log").exists()
    # the keys the store indexes (distci.judge.store.read_bisect)
    assert {k: report[k] for k in ("test_id", "axis", "good", "bad", "status")} == {
        "test_id": TEST_ID, "axis": f"{PACKAGE}-wheelhouse", "good": "1.2", "bad": "1.3", "status": "boundary"}


def test_from_regression_takes_the_question_from_the_store_and_records_the_answer(work, monkeypatch, capsys):
    monkeypatch.chdir(work / "work")
    runs, db = work / "runs", work / "store.sqlite"
    cell = "cpu-demo-ws2-fix_off"
    green = {"torch": "2.13.0+cpu", "packages": ["torch==2.13.0+cpu", f"{PACKAGE}==1.2"], "fixes_mode": "none"}
    red = dict(green, packages=["torch==2.13.0+cpu", f"{PACKAGE}==1.3"])
    write_run(runs, "night1", cell, [{"test_id": TEST_ID}], started_at=datetime(2026, 3, 1, tzinfo=timezone.utc),
              stack=green)
    write_run(runs, "night2", cell, [{"test_id": TEST_ID, "outcome": "failed", "message": "AssertionError: 5.0"}],
              started_at=datetime(2026, 3, 2, tzinfo=timezone.utc), stack=red)
    with Store(db) as store:
        ingest_runs(store, [runs])
        assert find_regression(store, TEST_ID).ident == f"night2::{TEST_ID}"
        assert find_regression(store, "night2").ident == f"night2::{TEST_ID}"
        with pytest.raises(BisectError, match="verdict 'pass', not 'regression'"):
            find_regression(store, f"night1::{TEST_ID}")

    assert cli.main(["bisect", "--list-regressions", "--store", str(db)]) == 0
    assert f"night2::{TEST_ID}  ({cell})" in capsys.readouterr().out

    argv = ["bisect", "--from-regression", f"night2::{TEST_ID}", "--store", str(db), *common(work)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"regression night2::{TEST_ID} in {cell}: {PACKAGE} 1.2 (green, run night1) -> 1.3 (red" in out
    assert f"first bad: {PACKAGE}==1.3 (last good: {PACKAGE}==1.2)" in out
    with Store(db) as store:
        [row] = store.bisects()
    assert (row.test_id, row.cell_id, row.good, row.bad, row.status) == (TEST_ID, cell, "1.2", "1.3", "boundary")
    with Store(work / "rebuilt.sqlite") as store:  # the reports alone give the same row
        assert import_bisects(store, work / "out") == 2  # 1.0..1.3 and 1.2..1.3: one answer
        assert [(b.good, b.bad, b.report_path) for b in store.bisects()] == [("1.2", "1.3", row.report_path)]


def test_changed_axis_prefers_torch_and_reads_nightlies_and_git_builds():
    def stack(**versions):
        return Stack(packages=[f"{k}=={v}" for k, v in versions.items()])

    change = changed_axis(stack(torch="2.12.0.dev20260301+cu130", torchao="0.18.0.dev20260301"),
                          stack(torch="2.12.0.dev20260303+cu130", torchao="0.18.0.dev20260303"))
    assert (change.package, change.source, change.good, change.bad) == ("torch", "nightly", "2026-03-01", "2026-03-03")
    change = changed_axis(stack(torch="2.10.0+cu128", torchao="0.17.0+git1a2b3c4d"),
                          stack(torch="2.10.0+cu128", torchao="0.17.0+git9f8e7d6c5b"))
    assert (change.package, change.source, change.good, change.bad) == ("torchao", "git", "1a2b3c4d", "9f8e7d6c5b")
    change = changed_axis(stack(torch="2.9.1+cu128", numpy="2.1.0"), stack(torch="2.10.0+cu128", numpy="2.2.0"))
    assert (change.package, change.source, change.good, change.bad) == ("torch", "release", "2.9.1", "2.10.0")
    assert changed_axis(stack(torch="2.9.1", numpy="2.1.0"), stack(torch="2.10.0", numpy="2.2.0"),
                        prefer="numpy").bad == "2.2.0"
    with pytest.raises(BisectError, match="same package versions"):
        changed_axis(stack(torch="2.9.1"), stack(torch="2.9.1"))
    with pytest.raises(BisectError, match="a release and a nightly"):
        changed_axis(stack(torch="2.9.1"), stack(torch="2.10.0.dev20260301"))


def test_base_libraries_are_linked_where_rpaths_look_and_packages_are_not_merged(tmp_path):
    """A CUDA torch wheel in the candidate venv finds `../../nvidia/<lib>/lib` next to
    itself; the base's nvidia libraries must appear there, the candidate's own win, and a
    real package both have (torchao) keeps only the candidate's files."""
    base, site = tmp_path / "base", tmp_path / "site"
    for path, text in {"nvidia/__init__.py": "", "nvidia/cublas/lib/libcublas.so.12": "base",
                       "nvidia/nccl/lib/libnccl.so.2": "base", "numpy/__init__.py": "V = 1",
                       "torchao/__init__.py": "V = 'base'", "torchao/gone/__init__.py": "",
                       "numpy-2.0.dist-info/METADATA": ""}.items():
        (base / path).parent.mkdir(parents=True, exist_ok=True)
        (base / path).write_text(text)
    for path, text in {"nvidia/__init__.py": "", "nvidia/nccl/lib/libnccl.so.2": "mine",
                       "torchao/__init__.py": "V = 'mine'"}.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    link_base_tree(base, site)
    assert (site / "nvidia" / "cublas").is_symlink()
    assert (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").read_text() == "mine"
    assert (site / "numpy").is_symlink() and not (site / "numpy-2.0.dist-info").exists()
    assert not (site / "torchao" / "gone").exists()
    assert (base / "nvidia" / "nccl" / "lib" / "libnccl.so.2").read_text() == "base"


def test_pins_hold_the_stack_less_the_axis_and_distcis_own(tmp_path):
    stack = {"packages": ["torch==2.5.1+cu124", "Jinja2==3.1.6", "distci==0.1.0", "distci-fixes==0.1.0",
                          "nvidia-nccl-cu12==2.21.5", "numpy==2.4.6"], "fixes_mode": "none"}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "stack.json").write_text(json.dumps(stack))
    pins = Pins.from_stack(load_stack(tmp_path / "run"))
    assert pins.version("Torch") == "2.5.1+cu124"
    assert pins.requirements("torch") == ["jinja2==3.1.6", "numpy==2.4.6", "nvidia-nccl-cu12==2.21.5"]
    assert pins.harness_requirements("numpy")[-2:] == ["pytest", "packaging"]
    with pytest.raises(ConfigError, match="not pinned with =="):
        Pins.from_stack(Stack(packages=["torch>=2.5"]))
    with pytest.raises(ConfigError, match="no `packages` list"):
        (tmp_path / "bad.json").write_text("{}")
        load_stack(tmp_path / "bad.json")
