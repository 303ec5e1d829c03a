"""Result.stack is a Stack, and the bytes on disk are what earlier versions wrote.

The expected lines are literals (what the writer before Result.stack became a Stack
produced for the same Result), never built by the code under test: a partial stack, a
None written as None, keys this version does not know.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from distci.errors import StoreError
from distci.judge.ingest import ingest_runs
from distci.judge.store import Store
from distci.results import Result, write_junit
from distci.rundir import RunDir, read_run
from distci.stack import Stack

STACK = {"torch": "2.5.0", "packages": None, "partial": True, "git_version": "abc", "future": {"b": 1, "a": [1, None]}}
LINE = (b'{"cell_id": "cpu-ws2", "duration_s": 0.0, "error_signature": null, "failure_kind": "assert", '
        b'"known_issue": null, "load": null, "log_path": "", "message": "boom", "outcome": "failed", "ranks": [], '
        b'"repro": "", "rerun_messages": [], "rerun_outcomes": [], "reruns": 0, "run_id": "run-1", "schema": 1, '
        b'"stack": {"future": {"a": [1, null], "b": 1}, "git_version": "abc", "packages": null, "partial": true, '
        b'"torch": "2.5.0"}, "started_at": "2026-12-06T00:00:00+00:00", "test_id": "suites/test_x.py::test_y"}\n')


def _result(stack: dict | Stack) -> Result:
    return Result(run_id="run-1", cell_id="cpu-ws2", test_id="suites/test_x.py::test_y", outcome="failed",
                  stack=stack, failure_kind="assert", message="boom", started_at="2026-12-06T00:00:00+00:00")


def test_a_partial_stack_with_unknown_keys_keeps_its_bytes(tmp_path: Path) -> None:
    first = _result(STACK)
    assert isinstance(first.stack, Stack) and first.stack.torch == "2.5.0" and first.stack.packages is None
    assert first.stack.extra == {"git_version": "abc", "future": {"b": 1, "a": [1, None]}}
    RunDir(tmp_path / "a").append(first)
    assert (tmp_path / "a" / "results.jsonl").read_bytes() == LINE
    (back,) = RunDir(tmp_path / "a").results()
    assert isinstance(back.stack, Stack) and back.stack.partial is True and back.stack.python is None
    RunDir(tmp_path / "b").append(back)  # read, then written again: nothing gained or lost
    assert (tmp_path / "b" / "results.jsonl").read_bytes() == LINE


def test_an_old_results_line_reads_and_lands_in_the_store_unchanged(tmp_path: Path) -> None:
    """A line as earlier versions wrote it (no run.json, no stack.json): its stack becomes the
    run's, and the store's stack_json is the same object."""
    run_dir = tmp_path / "runs" / "run-1"
    run_dir.mkdir(parents=True)
    (run_dir / "results.jsonl").write_bytes(LINE)
    run = read_run(run_dir)
    assert isinstance(run.stack, Stack) and run.stack.torch == "2.5.0"
    with Store(tmp_path / "s.sqlite") as store:
        ingest_runs(store, [tmp_path / "runs"])
        (stored,) = store.conn.execute("SELECT stack_json FROM runs WHERE run_id = 'run-1'").fetchone()
        row = store.run("run-1")
    assert stored == ('{"future": {"a": [1, null], "b": 1}, "git_version": "abc", "packages": null, '
                      '"partial": true, "torch": "2.5.0"}')
    assert row is not None and isinstance(row.stack, Stack) and row.stack.get("git_version") == "abc"


def test_junit_properties_are_the_stack_as_written(tmp_path: Path) -> None:
    path = write_junit([_result(STACK)], tmp_path / "junit.xml")
    tree = ET.parse(path)
    suite_props = {p.get("name"): p.get("value") for p in tree.find("testsuite/properties")}
    assert suite_props == {"stack.git_version": "abc", "stack.partial": "True", "stack.torch": "2.5.0"}
    case_props = {p.get("name"): p.get("value") for p in tree.find("testsuite/testcase/properties")}
    assert {k: v for k, v in case_props.items() if k.startswith("stack.")} == {"stack.torch": "2.5.0"}


def test_a_stack_json_that_is_not_an_object_is_a_store_error(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "run-1"
    run_dir.mkdir(parents=True)
    (run_dir / "results.jsonl").write_bytes(LINE)
    with Store(tmp_path / "s.sqlite") as store:
        ingest_runs(store, [tmp_path / "runs"])
        store.conn.execute("UPDATE runs SET stack_json = '[1]'")
        with pytest.raises(StoreError, match="stack_json is not a JSON object"):
            store.run("run-1")
