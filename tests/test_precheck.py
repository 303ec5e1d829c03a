"""`-k` / `--test` checked before provisioning (distci.run.precheck): a selection that
matches nothing fails in seconds with one line, nothing provisioned, where the ids can be
collected without the cell; elsewhere one line says why it was not checked and the run
goes on. Collections are narrowed to one suite file (`--test suites/test_tp_mlp.py`) to
stay a few seconds each."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from distci.errors import SelectionError
from distci.matrix import load_matrix
from distci.run.precheck import (Collector, Remembered, check_selection, collection_inputs, find_collector,
                                  pinned_torch)

pytest.importorskip("torch")
ONE_FILE = "suites/test_tp_mlp.py"


def default_cell():
    return load_matrix(REPO / "matrix.toml").default_cell()


def test_a_selection_matching_nothing_fails_before_anything_is_provisioned(tmp_path):
    env = {**os.environ, "DISTCI_ENV_ROOT": str(tmp_path / "envs"), "DISTCI_WHEELHOUSE_ROOT": str(tmp_path / "wh"),
           "COLUMNS": "400"}
    cases = {("-k", "tp_mpl", "--test", ONE_FILE): "no test selected by -k tp_mpl --test suites/test_tp_mlp.py in cell"}
    for args, message in cases.items():
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "distci", "run", *args, "--runs-root", str(tmp_path / "runs")],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        took = time.monotonic() - started
        errors = [line for line in proc.stderr.splitlines() if line.startswith("distci: error:")]
        assert proc.returncode == 2 and len(errors) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert message in errors[0]
        assert f"in cell {default_cell().id}, checked before provisioning (this controller has torch" in errors[0]
        assert "list its test ids with: " in errors[0] and "--collect-only -q suites" in errors[0]
        assert not (tmp_path / "runs").exists() and not (tmp_path / "envs").exists(), "something was provisioned"
        assert not (tmp_path / "wh").exists()
        print(f"{args}: refused in {took:.1f}s")


def test_no_selection_is_nothing_to_check():
    nothing: list[str] = []
    check_selection([default_cell()], tests=[], keyword=None, tier="pr", python=None, env_root=Path("unused"),
                    log=nothing.append)
    assert nothing == []  # no -k, no --test: nothing to check, no collection


def test_where_the_ids_need_the_cells_stack_it_says_so_and_goes_on(tmp_path):
    cell = default_cell()
    nightly = next(c for c in load_matrix(REPO / "matrix.toml").cells if pinned_torch(c) is None)
    logs: list[str] = []
    check_selection([nightly], tests=[], keyword="nothing_at_all", tier=None, python=None, env_root=tmp_path,
                    log=logs.append)
    assert logs == [f"-k nothing_at_all: not checked before provisioning: cell {nightly.id} does not pin a torch "
                    f"release, so its ids are known once its env is up"]
    # An interpreter that cannot collect (here: a bare venv, no pytest): nothing is refused.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    logs = []
    check_selection([cell], tests=[ONE_FILE], keyword="nothing_at_all", tier=None,
                    python=str(tmp_path / "bare" / "bin" / "python"), env_root=tmp_path, log=logs.append)
    assert len(logs) == 1 and f"collecting cell {cell.id}'s suites here failed" in logs[0], logs
    # A pinned release no interpreter here has.
    other = dataclasses.replace(cell, torch=dataclasses.replace(cell.torch, spec="==2.4.0"))
    assert find_collector(other, None, tmp_path) == (
        f"no interpreter here has pytest and cell {other.id}'s torch 2.4.0 yet (its env checks it)")


def test_a_warm_env_of_the_cells_torch_collects_when_the_controller_cannot(tmp_path):
    """The nox controller has no torch: a stack env already provisioned with the cell's torch
    release (found by its dist-info, confirmed by running it) collects instead."""
    cell = default_cell()
    release = pinned_torch(cell)
    assert release == "2.13.0"
    other = dataclasses.replace(cell, torch=dataclasses.replace(cell.torch, spec="==2.12.1"))
    env = tmp_path / "stack-0123" / "lib" / "python3.11" / "site-packages"
    (env / "torch-2.12.1+cpu.dist-info").mkdir(parents=True)
    python = tmp_path / "stack-0123" / "bin" / "python"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\necho 2.12.1\n")  # what the probe prints for torch 2.12.1 with pytest
    python.chmod(0o755)
    (tmp_path / "stack-4567" / "lib" / "python3.11" / "site-packages" / "torch-2.11.0.dist-info").mkdir(parents=True)
    assert find_collector(other, None, tmp_path) == Collector(str(python), "a provisioned env has torch 2.12.1")
    python.write_text("#!/bin/sh\nexit 1\n")  # a broken env (no pytest) is not used
    assert isinstance(find_collector(other, None, tmp_path), str)


def test_the_check_is_refused_as_a_selection_error_type():
    with pytest.raises(SelectionError, match=r"no test selected by --test suites/test_tp_mlp.py::test_nope in cell"):
        check_selection([default_cell()], tests=[f"{ONE_FILE}::test_nope"], keyword=None, tier=None,
                        python=sys.executable, env_root=Path("unused"))


def test_a_matching_selection_goes_on_says_how_many_and_is_remembered_and_a_refusal_never_is(tmp_path):
    """A selection that matches goes on and says how many it selected; the same selection again
    is not collected again; another -k, or a refused one, is. (One collection of the matching
    selection serves both: each collection of the suite file is a pytest of its own.)"""
    remembered = Remembered(tmp_path / "precheck")
    first: list[str] = []
    check_selection([default_cell()], tests=[ONE_FILE], keyword="eager and sgd", tier=None, python=None,
                    env_root=Path("unused"), log=first.append, remembered=remembered)
    (line,) = first
    cell = re.escape(default_cell().id)
    said = re.fullmatch(rf"-k 'eager and sgd' --test {ONE_FILE}: (\d+) test\(s\) of cell {cell} "
                        r"selected \(checked before provisioning\)", line)
    assert said and int(said.group(1)) >= 1, line
    assert len(list((tmp_path / "precheck").glob("*.json"))) == 1
    again: list[str] = []
    check_selection([default_cell()], tests=[ONE_FILE], keyword="eager and sgd", tier=None, python=None,
                    env_root=Path("unused"), log=again.append, remembered=remembered)
    assert again == [f"-k 'eager and sgd' --test {ONE_FILE}: {said.group(1)} test(s) of cell {default_cell().id} "
                     "selected (checked before provisioning, as an earlier check of the same selection, suites and "
                     "torch found)"]
    # refused, and collected again every time: a refusal is never remembered
    with pytest.raises(SelectionError, match="no test selected by -k 'eager and nothing_at_all'"):
        check_selection([default_cell()], tests=[ONE_FILE], keyword="eager and nothing_at_all", tier=None,
                        python=None, env_root=Path("unused"), remembered=remembered)
    assert len(list((tmp_path / "precheck").glob("*.json"))) == 1


def test_what_a_remembered_check_is_keyed_by(tmp_path):
    """Any file of the suites, distci or the selected tests' folder edited (size or mtime), a
    test outside the checkout: the inputs differ, or cannot be pinned down."""
    for name in ("suites/test_a.py", "distci/x.py", "tests/cases/test_b.py", "docs/notes.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    before = collection_inputs(tmp_path, ["tests/cases/test_b.py::test_one"])
    assert {p for p, _, _ in before} == {"suites/test_a.py", "distci/x.py", "tests/cases/test_b.py"}
    assert collection_inputs(tmp_path, ["suites/test_a.py"]) != before  # tests/ is read only when selected
    (tmp_path / "docs" / "notes.md").write_text("not read by a collection\n")
    assert collection_inputs(tmp_path, ["tests/cases/test_b.py::test_one"]) == before
    for edited in ("suites/test_a.py", "distci/x.py", "tests/cases/test_b.py"):
        os.utime(tmp_path / edited, ns=(1, 1))
        assert collection_inputs(tmp_path, ["tests/cases/test_b.py::test_one"]) != before, edited
        before = collection_inputs(tmp_path, ["tests/cases/test_b.py::test_one"])
    (tmp_path / "test_root.py").write_text("x = 1\n")  # a test file at the checkout's root
    assert "test_root.py" in {p for p, _, _ in collection_inputs(tmp_path, ["test_root.py::test_one"])}
    assert collection_inputs(tmp_path, ["/elsewhere/test_c.py"]) is None
    assert collection_inputs(tmp_path, ["../other/test_c.py"]) is None
    cell, collector = default_cell(), Collector(sys.executable, "test")
    keys = {Remembered(tmp_path).key(cell, collector, tests=[ONE_FILE], keyword=k, tier=t)
            for k, t in [("a", None), ("b", None), ("a", "nightly")]}
    assert len(keys) == 3 and None not in keys
    # the process's own names (an owned controller's run token, pytest's current test, xdist's
    # worker) are no input of a collection: the same check under another of them is found again
    key = Remembered(tmp_path).key(cell, collector, tests=[ONE_FILE], keyword="a", tier=None)
    for name, value in (("DISTCI_RUN_TOKEN", "another"), ("PYTEST_CURRENT_TEST", "t.py::x (call)"),
                        ("PYTEST_XDIST_TESTRUNUID", "another"), ("PYTEST_XDIST_WORKER", "gw9")):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(name, value)
            assert Remembered(tmp_path).key(cell, collector, tests=[ONE_FILE], keyword="a", tier=None) == key, name
    with pytest.MonkeyPatch.context() as mp:  # what a collection reads still counts
        mp.setenv("PYTEST_ADDOPTS", "-p no:randomly")
        assert Remembered(tmp_path).key(cell, collector, tests=[ONE_FILE], keyword="a", tier=None) != key
