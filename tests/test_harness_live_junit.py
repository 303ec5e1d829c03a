"""junit.xml is whole on disk however the runner dies: killed mid-test with SIGKILL (no
handler, no closing), the run leaves a JUnit file that parses, with the tests that
finished as they finished, the one in flight as interrupted and the rest as not run."""

from __future__ import annotations

import json
import signal
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import CASES, run_pytest
from distci.harness.recorder import NOT_RUN

pytestmark = pytest.mark.slow  # a pytest child with the harness plugin


def test_a_runner_killed_mid_test_leaves_a_junit_file_that_says_how_far_it_got(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_pytest([str(CASES / "test_killed.py"), "--distci-run-dir", str(run_dir),
                       "--distci-cell", "cpu-test-ws2-fix_on"])
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-2000:]
    recorded = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [(r["test_id"].rpartition("::")[2], r["outcome"]) for r in recorded] == \
        [("test_first", "passed"), ("test_second_is_skipped", "skipped")]

    cases = {c.get("name"): c for c in ET.parse(run_dir / "junit.xml").getroot().iter("testcase")}
    assert list(cases) == ["test_first", "test_second_is_skipped", "test_killed_here", "test_never_started"]
    assert list(cases["test_first"]) and not cases["test_first"].findall("./skipped") + \
        cases["test_first"].findall("./error") + cases["test_first"].findall("./failure")
    assert "skipped on purpose" in cases["test_second_is_skipped"].find("skipped").get("message")
    error = cases["test_killed_here"].find("error")
    assert error is not None and error.get("message", "").startswith("Interrupted"), ET.tostring(cases["test_killed_here"])
    assert cases["test_never_started"].find("skipped").get("message") == NOT_RUN
    suite = ET.parse(run_dir / "junit.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("errors"), suite.get("skipped")) == ("4", "1", "2")
    assert not list(run_dir.glob(".junit.xml.*.tmp")), "no temporary file left beside it"
