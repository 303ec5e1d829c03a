"""Fault injection on the data side: damaged run directories, a re-judging registry, and
JUnit that agrees with the gate.

Each case damages what a real runner leaves behind (a results.jsonl line that is not a
Result, an unreadable run.json, a line of another run) and asserts that the damage is
counted and named by file:line, that the damaged run alone is rejected, and that every
good run is still indexed.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fixtures_runs import result, stack, write_run

from distci.judge import ingest as ingest_mod
from distci.judge.ingest import ingest, rebuild
from distci.results import write_junit
from distci.rundir import RESULTS_FILE, parse_results
from distci.judge.store import Store

T0 = datetime(2026, 11, 20, 2, 0, tzinfo=timezone.utc)
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
A = "suites/test_tp_mlp.py::test_tp_mlp[none-none-sgd-pr]"
B = "suites/test_tp_mlp.py::test_tp_mlp[none-none-adamw-pr]"
S = stack("2.13.0+cpu", "5a" * 20)

BAD_LINES = [
    (b"[1, 2, 3]\n", "not a Result (a Result is a JSON object, not list)"),
    (b'{"run_id": "r", "bogus": 1}\n', "not a Result (unknown field(s) bogus)"),
    (b"\xff\xfe not text\n", "not UTF-8"),
    (b"{not json\n", "not JSON"),
    (b'{"run_id": "good", "cell_id": "c", "test_id": "t", "outcome": "exploded", "stack": {}}\n', "not a Result"),
]


def _two_good_runs(root: Path) -> None:
    write_run(root, "good1", CELL, [{"test_id": A}, {"test_id": B}], started_at=T0, stack=S)
    write_run(root, "good2", CELL, [{"test_id": A}], started_at=T0 + timedelta(days=1), stack=S)


def test_bad_lines_are_counted_with_file_and_line_and_good_lines_still_count(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _two_good_runs(runs)
    damaged = write_run(runs, "damaged", CELL, [{"test_id": A}, {"test_id": B}],
                        started_at=T0 + timedelta(days=2), stack=S)
    jsonl = damaged / RESULTS_FILE
    good = jsonl.read_bytes().splitlines(keepends=True)
    jsonl.write_bytes(good[0] + b"".join(line for line, _ in BAD_LINES) + good[1])

    report = ingest([runs], tmp_path / "store.sqlite")
    assert sorted(report.added) == ["damaged", "good1", "good2"] and report.results == 5
    assert [p.split(": ", 1)[0] for p in report.bad_lines] == [f"{jsonl}:{n}" for n in range(2, 2 + len(BAD_LINES))]
    for problem, (_, why) in zip(report.bad_lines, BAD_LINES):
        assert why in problem, problem
    text = report.summary()
    assert f"skipped 0 unreadable runs and {len(BAD_LINES)} bad lines:" in text and f"{jsonl}:3" in text
    with Store(tmp_path / "store.sqlite") as s:
        assert {r.test_id for r in s.results(run_id="damaged")} == {A, B}


def test_an_unreadable_run_is_rejected_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    _two_good_runs(runs)
    broken = write_run(runs, "broken", CELL, [{"test_id": A}], started_at=T0 + timedelta(days=3), stack=S)
    (broken / "run.json").write_text("[1, 2")
    nameless = runs / "nameless"
    nameless.mkdir()
    (nameless / RESULTS_FILE).write_bytes(b"[1, 2, 3]\n")
    db = tmp_path / "store.sqlite"
    assert ingest_mod.main([str(runs), "--store", str(db), "--known-issues", str(tmp_path / "none.toml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 runs added") and "skipped 2 unreadable runs and 1 bad lines:" in out
    assert f"{broken / 'run.json'}: not valid JSON" in out
    assert f"{nameless}: run has no run id or cell id" in out and f"{nameless / RESULTS_FILE}:1: not a Result" in out
    with Store(db) as s:
        assert [r.run_id for r in s.runs()] == ["good1", "good2"]


def test_a_line_of_another_run_is_skipped_not_fatal(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = write_run(runs, "r1", CELL, [{"test_id": A}], started_at=T0, stack=S)
    stray = result(B, run_id="other-run", cell_id=CELL, stack=S)
    with open(run / RESULTS_FILE, "a") as fh:
        fh.write(json.dumps(stray.to_dict()) + "\n")
    report = ingest([runs], tmp_path / "store.sqlite")
    assert report.added == ["r1"] and report.results == 1
    assert report.bad_lines == [f"{run / RESULTS_FILE}:2: result {B} belongs to run other-run of cell {CELL}, "
                                f"not run r1 of cell {CELL}"]


def test_a_torn_last_line_is_reported(tmp_path: Path) -> None:
    run = write_run(tmp_path, "r1", CELL, [{"test_id": A}, {"test_id": B}], started_at=T0, stack=S)
    data = (run / RESULTS_FILE).read_bytes()
    (run / RESULTS_FILE).write_bytes(data[:-40])
    problems: list = []
    assert [r.test_id for r in parse_results(run, problems)] == [A]
    assert [(p.line, p.reason.split(" (")[0]) for p in problems] == [(2, "not JSON")]


REGISTRY = """
[[issue]]
id = "pytorch1-mlp-loss"
title = "the MLP loss drifts"
tests = ["suites/test_tp_mlp.py::*"]
signature = "loss mismatch"
upstream = "https://github.com/pytorch/pytorch/issues/1"
"""


def test_editing_the_registry_rejudges_stored_runs_on_rebuild(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    fail = {"test_id": A, "outcome": "failed", "failure_kind": "assert",
            "message": "AssertionError: loss mismatch 0.5 > 1e-05"}
    write_run(runs, "n1", CELL, [{"test_id": A}, {"test_id": B}], started_at=T0, stack=S)
    write_run(runs, "n2", CELL, [fail, {"test_id": B}], started_at=T0 + timedelta(days=1),
              stack=stack("2.13.0+cpu", "6b" * 20))
    registry = tmp_path / "known_issues.toml"
    registry.write_text("")
    db = tmp_path / "store.sqlite"
    rebuild(db, runs, known_issues=registry)
    with Store(db) as s:
        assert (s.result("n2", A).verdict, s.result("n2", A).known_issue) == ("regression", None)
    registry.write_text(REGISTRY)
    rebuild(db, runs, known_issues=registry)
    with Store(db) as s:
        got = s.result("n2", A)
        assert (got.verdict, got.known_issue) == ("xfail", "pytorch1-mlp-loss")
        assert s.result("n1", A).verdict == "fixed"  # a pass where the entry applies: it can retire
    registry.write_text("")
    rebuild(db, runs, known_issues=registry)
    with Store(db) as s:
        assert s.result("n2", A).verdict == "regression"


def _junit_cases(path: Path) -> dict[str, ET.Element]:
    return {c.get("name"): c for c in ET.parse(path).getroot().iter("testcase")}


def test_junit_agrees_with_the_gate(tmp_path: Path) -> None:
    """Known issues are skipped as pytest.xfail with their id; a pass on a rerun is a pass
    with its flaky failures; a failure on every try carries its rerun failures; every
    testcase has file and line."""
    repo = tmp_path / "repo"
    (repo / "suites").mkdir(parents=True)
    (repo / "suites" / "test_x.py").write_text("import pytest\n\n\ndef test_known():\n    pass\n\n\n"
                                               "@pytest.mark.parametrize('p', [1])\ndef test_flaky(p):\n    pass\n")
    common = {"run_id": "r", "cell_id": CELL, "stack": S}
    results = [
        result("suites/test_x.py::test_known", "failed", failure_kind="assert", message="AssertionError: known",
               known_issue="pytorch1-mlp-loss", **common),
        result("suites/test_x.py::test_flaky[1]", "failed", failure_kind="hang", message="hang: try 1",
               rerun_outcomes=["passed"], **common),
        result("suites/test_x.py::test_gone", "failed", failure_kind="assert", message="AssertionError: try 1",
               rerun_outcomes=["failed"], **common),
        result("external/torchao/test_fp8.py::test_a", "passed", **common),
    ]
    results[2].rerun_messages = ["AssertionError: try 2"]
    cases = _junit_cases(write_junit(results, tmp_path / "junit.xml", root=repo))
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert (suite.get("failures"), suite.get("skipped"), suite.get("errors")) == ("1", "1", "0")

    known = cases["test_known"]
    (skipped,) = known.findall("skipped")
    assert skipped.get("type") == "pytest.xfail" and known.find("failure") is None
    props = {p.get("name"): p.get("value") for p in known.iter("property")}
    assert props["known_issue"] == "pytorch1-mlp-loss"

    flaky = cases["test_flaky[1]"]
    assert flaky.find("failure") is None and [f.text for f in flaky.findall("flakyFailure")] == ["hang: try 1"]
    gone = cases["test_gone"]
    assert gone.find("failure") is not None
    assert [f.text for f in gone.findall("rerunFailure")] == ["AssertionError: try 2"]

    assert (known.get("file"), known.get("line")) == ("suites/test_x.py", "4")
    assert (flaky.get("file"), flaky.get("line")) == ("suites/test_x.py", "9")
    assert all(c.get("file") and c.get("line") is not None for c in cases.values())
